"""What a run measured, as the results file holds it: the HDR recorders and their statistics
(metrics.py), SLOs and their attainment (slo.py, attainment.py), the per-turn, per-context and
per-session breakdowns (turns.py), the Pareto frontiers (pareto.py), and the file itself: its
schema, atomic write and validated read (file.py)."""
