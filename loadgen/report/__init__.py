"""Reports of results files: the files read and named (runs.py), the per-level table `loadgen
replay` prints (table.py), the terminal report with its sweep summary (terminal.py), the PNG plots
(plots.py) and the self-contained HTML report (html.py) with its timelines (timeline.py, drawn by
static/timeline.js)."""
