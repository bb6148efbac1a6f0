"""The benchmark suite: `make bench` (``python -m bench``). See README."""
