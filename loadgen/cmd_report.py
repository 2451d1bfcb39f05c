"""`loadgen report RESULTS [...]`: tables, plots, HTML, CSV and InferenceX aggregates of one or
more results files, with the Pareto frontiers over all their levels.

Formats (comma-separated, or `all`): table (stdout), csv (levels.csv), png (plots, see
loadgen/plots.py), html (report.html, self-contained), infx (infx.json, see loadgen/export.py).
Files go to --out (default: a `report` folder beside the first results file).
Exit codes: 0 written, 2 bad input (missing or malformed file, wrong schema, unknown format).
"""

from __future__ import annotations

import argparse
from pathlib import Path

FORMATS = ("table", "csv", "png", "html", "infx")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="tables, plots, HTML, CSV and InferenceX aggregates of results files",
        description="Report one or more results files (agentload.result/1): per-level tables, a "
        "sweep summary with the Pareto frontiers over all levels of all files, PNG plots "
        "(throughput per GPU vs interactivity, vs p90 E2EL and vs e2e interactivity; TTFT and "
        "E2EL percentiles per level), a self-contained HTML report, CSV (one row per level per "
        "file) and InferenceX aggregate keys (--format infx).",
    )
    p.add_argument("results", nargs="+", metavar="RESULTS", help="results file, or a folder holding result.json")
    p.add_argument("--format", default="table", metavar="F[,F...]",
                   help=f"any of {', '.join(FORMATS)}, or all (default: table)")
    p.add_argument("--out", metavar="DIR", help="folder for the files (default: report/ beside the first results file)")
    p.set_defaults(func=run)


def parse_formats(text: str) -> list[str]:
    from loadgen.errors import UsageError

    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(FORMATS)
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise UsageError(f"--format: unknown format {', '.join(unknown) or repr(text)}; "
                         f"choose from {', '.join(FORMATS)} or all")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> int:
    from loadgen.report import format_report, load_runs

    formats = parse_formats(args.format)
    runs = load_runs(args.results)
    if "table" in formats:
        print(format_report(runs))
    files = [name for name in formats if name != "table"]
    if not files:
        return 0
    out = Path(args.out) if args.out else runs[0].path.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "csv" in files:
        from loadgen.export import write_csv

        written.append(write_csv(runs, out / "levels.csv"))
    if "infx" in files:
        from loadgen.export import write_infx

        written.append(write_infx(runs, out / "infx.json"))
    if "png" in files:
        from loadgen.plots import write_plots

        written += write_plots(runs, out)
    if "html" in files:
        from loadgen.html_report import write_html

        written.append(write_html(runs, out / "report.html"))
    for path in written:
        print(f"wrote {path}")
    return 0
