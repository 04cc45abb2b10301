"""bench experiment."""
