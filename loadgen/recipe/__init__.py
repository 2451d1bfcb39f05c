"""Recipes: one YAML file names a server, a workload, a sweep and variants; `loadgen recipe run`
runs every variant (repeats interleaved), compares each with the first and writes one report.

schema.py: the frozen dataclass tree and its YAML form; validate.py: its cross-field rules;
server.py: starting, health-checking and stopping a variant's server; memory.py: the GPU memory
shares of kept servers side by side; runner.py: the interleaved runs, resume and the results
folder; from_infx.py (with infx_serve.py, infx_fixed.py): recipes from InferenceX config entries.
"""
