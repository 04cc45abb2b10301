"""Examples a user copies: their own model, data and loop on this project (docs/own_model.md)."""
