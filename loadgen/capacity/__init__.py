"""Capacity under an SLO: the search's settings and flags (config.py), the probe-then-bisect search
and its interval (search.py), and its answer in words (describe.py). A replay runs the search as its
sweep of levels (loadgen/run/sweep.py)."""
