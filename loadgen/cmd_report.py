"""`loadgen report RESULTS [...]`: tables, plots, HTML, CSV and InferenceX rows of one or more
results files, with the Pareto frontiers over all their levels.

Formats (comma-separated, or `all` for table, csv, png and html): table (stdout), csv
(levels.csv), png (plots, see loadgen/plots.py), html (report.html, self-contained), and the two
InferenceX shapes, asked for by name because they need the run's identity: infx (infx.json,
fixed-sequence rows) and agentx (agentx.json, agentic rows); see loadgen/export/infx.py and
loadgen/export/infx_identity.py for their keys, statistics and the identity flags' defaults.
Files go to --out (default: a `report` folder beside the first results file).
Exit codes: 0 written, 2 bad input (missing or malformed file, wrong schema, unknown format,
identity a row needs and neither the run nor a flag gives).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.export.infx_identity import SPEC_METHODS, IdentityFlags

REPORT_FORMATS = ("table", "csv", "png", "html")
INFX_FORMATS = {"infx": "infx.json", "agentx": "agentx.json"}
FORMATS = (*REPORT_FORMATS, *INFX_FORMATS)
_DEFAULTS = IdentityFlags()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="tables, plots, HTML, CSV and InferenceX rows of results files",
        description="Report one or more results files (agentload.result/1): per-level tables, a "
        "sweep summary with the Pareto frontiers over all levels of all files, PNG plots "
        "(throughput per GPU vs interactivity, vs p90 E2EL and vs e2e interactivity; TTFT and "
        "E2EL percentiles per level; TTFT p50/p90 against context tokens where levels have per-context "
        "rows), a self-contained HTML report, CSV (one row per level per "
        "file), and rows InferenceX ingests: --format infx (fixed-sequence) or agentx (agentic).",
    )
    p.add_argument("results", nargs="+", metavar="RESULTS", help="results file, or a folder holding result.json")
    p.add_argument("--format", default="table", metavar="F[,F...]",
                   help=f"any of {', '.join(FORMATS)}, or all (= {', '.join(REPORT_FORMATS)}) (default: table)")
    p.add_argument("--out", metavar="DIR", help="folder for the files (default: report/ beside the first results file)")
    _add_identity_args(p)
    p.set_defaults(func=run)


def _add_identity_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "InferenceX identity (infx, agentx)",
        "Keys InferenceX files each row under. Runs against our server fill hw (h200 when it served "
        "from GPUs), framework (agentload), precision (bf16), model prefix (its served model), tp "
        "(its GPU count: TP only) and spec decoding (its card); other servers need --hw, "
        "--framework, --precision and --model-prefix.")
    g.add_argument("--hw", default=_DEFAULTS.hw, help="runner hardware, e.g. h200, b200, mi355x (InferenceX GPU key)")
    g.add_argument("--framework", default=_DEFAULTS.framework, help="serving framework, e.g. vllm, sglang")
    g.add_argument("--precision", default=_DEFAULTS.precision, help="weights precision, e.g. fp8, fp4, bf16")
    g.add_argument("--model-prefix", default=_DEFAULTS.model_prefix,
                   help="InferenceX model prefix (infmax_model_prefix), e.g. dsv4, qwen3.5")
    g.add_argument("--image", default=_DEFAULTS.image, help="serving container image (default: empty)")
    g.add_argument("--spec-decoding", default=_DEFAULTS.spec_decoding, choices=SPEC_METHODS,
                   help="speculative method (default: mtp when our server speculates or the run expected a "
                   "golden AL, else none)")
    g.add_argument("--tp", type=_positive, default=_DEFAULTS.tp,
                   help="tensor-parallel degree (default: our server's GPUs, else the run's GPUs / (pp x pcp))")
    g.add_argument("--ep", type=_positive, default=_DEFAULTS.ep, help=f"expert parallelism (default: {_DEFAULTS.ep})")
    g.add_argument("--pp", type=_positive, default=_DEFAULTS.pp, help=f"pipeline parallelism (default: {_DEFAULTS.pp})")
    g.add_argument("--dcp-size", type=_positive, default=_DEFAULTS.dcp_size,
                   help=f"decode context parallelism, divides tp (default: {_DEFAULTS.dcp_size})")
    g.add_argument("--pcp-size", type=_positive, default=_DEFAULTS.pcp_size,
                   help=f"prefill context parallelism (default: {_DEFAULTS.pcp_size})")
    g.add_argument("--dp-attention", action="store_true", default=_DEFAULTS.dp_attention,
                   help="data-parallel attention was on")
    g.add_argument("--isl", type=_positive, default=_DEFAULTS.isl,
                   help="infx: nominal input length (default: the run's, when every request had the same)")
    g.add_argument("--osl", type=_positive, default=_DEFAULTS.osl,
                   help="infx: nominal output length (default: the run's, when every request had the same)")
    g.add_argument("--recipe-fingerprint", default=_DEFAULTS.recipe_fingerprint,
                   help="InferenceX recipe fingerprint (default: empty)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def parse_formats(text: str) -> list[str]:
    from loadgen.errors import UsageError

    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(REPORT_FORMATS)
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise UsageError(f"--format: unknown format {', '.join(unknown) or repr(text)}; "
                         f"choose from {', '.join(FORMATS)} or all")
    return list(dict.fromkeys(names))


def identity_flags(args: argparse.Namespace) -> IdentityFlags:
    return IdentityFlags(
        hw=args.hw, framework=args.framework, precision=args.precision, model_prefix=args.model_prefix,
        image=args.image, spec_decoding=args.spec_decoding, tp=args.tp, ep=args.ep, pp=args.pp,
        dcp_size=args.dcp_size, pcp_size=args.pcp_size, dp_attention=args.dp_attention, isl=args.isl,
        osl=args.osl, recipe_fingerprint=args.recipe_fingerprint)


def run(args: argparse.Namespace) -> int:
    from loadgen.report import format_report, load_runs

    formats = parse_formats(args.format)
    runs = load_runs(args.results)
    infx = _infx_rows(runs, formats, identity_flags(args))  # before writing anything: bad identity fails first
    if "table" in formats:
        print(format_report(runs))
    files = [name for name in formats if name != "table"]
    if not files:
        return 0
    out = Path(args.out) if args.out else runs[0].path.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "csv" in files:
        from loadgen.export.levels_csv import write_csv

        written.append(write_csv(runs, out / "levels.csv"))
    if infx:
        from loadgen.export.infx import write_rows

        written += [write_rows(rows, out / INFX_FORMATS[name]) for name, rows in infx.items()]
    plots = None
    if "png" in files:
        from loadgen.plots import render_plots

        plots = render_plots(runs, out)
        written += [png for png, _ in plots]
    if "html" in files:
        from loadgen.html_report import write_html

        written.append(write_html(runs, out / "report.html", plots))  # embeds the PNGs just written
    for path in written:
        print(f"wrote {path}")
    return 0


def _infx_rows(runs, formats: list[str], flags: IdentityFlags) -> dict[str, list]:
    from loadgen.errors import UsageError
    from loadgen.export.infx import agentx_rows, infx_rows
    from loadgen.export.infx_identity import ExportError

    build = {"infx": infx_rows, "agentx": agentx_rows}
    try:
        return {name: build[name](runs, flags) for name in INFX_FORMATS if name in formats}
    except ExportError as exc:
        raise UsageError(str(exc)) from exc
