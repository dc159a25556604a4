"""efd benchmark: the parts bench/run.py puts together (see bench/README.md)."""
