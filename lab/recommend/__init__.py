"""``python -m lab recommend``: the fastest concept to a quality target for a user's model (main.py)."""
