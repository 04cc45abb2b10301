"""A step trace as a picture: ``python -m lab.trace.plot RUN_DIR/trace/rank0.json OUT.png`` (:mod:`.plot`)."""
