"""scaling experiment."""
