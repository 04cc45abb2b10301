"""Time to accuracy: wall time, steps and epochs to a quality target, per exchange method."""
