"""Capacity under an SLO: the search's settings (config.py), the search and its interval
(search.py), and how a replay runs it (sweep.py)."""
