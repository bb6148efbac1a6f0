"""The benchmark suite: ``make bench``, or ``python -m bench`` from the
repository's root (see `bench.__main__` for what it measures and how)."""
