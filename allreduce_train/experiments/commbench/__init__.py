"""commbench experiment."""
