"""`loadgen report RESULTS [...]`: tables, plots, HTML, CSV and InferenceX rows of one or more
results files, with the Pareto frontiers over all their levels.

Formats (comma-separated, or `all` for table, csv, png and html): table (stdout), csv
(levels.csv), png (plots, see loadgen/report/plots.py), html (report.html, self-contained), and the two
InferenceX shapes, asked for by name because they need the run's identity: infx (infx.json,
fixed-sequence rows) and agentx (agentx.json, agentic rows); see loadgen/export/infx.py and
loadgen/export/infx_identity.py for their keys, statistics and the identity flags' defaults.
Files go to --out (default: a `report` folder beside the first results file), the InferenceX rows to
--infx-dir where given: InferenceX's ingest reads only the *.json directly inside the bmk_* and
results_* folders of its artifacts root, so that folder must be named so, and the report says where
rows written to --out must go.
Exit codes: 0 written, 2 bad input (missing or malformed file, wrong schema, unknown format,
identity a row needs and neither the run nor a flag gives).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.export.infx_identity import SPEC_METHODS, IdentityFlags

REPORT_FORMATS = ("table", "csv", "png", "html")
INFX_FORMATS = {"infx": "infx.json", "agentx": "agentx.json"}
# InferenceX-app packages/db/src/etl/benchmark-artifacts.ts: the ingest walks the direct *.json children of the
# folders of its artifacts root (one per CI artifact, named after it) whose names start so.
INFX_DIR_PREFIXES = ("bmk_", "results_")
INFX_DIR_EXAMPLE = "bmk_agentload"
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
    p.add_argument("--infx-dir", metavar="DIR",
                   help="infx, agentx: folder for infx.json and agentx.json, named bmk_* or results_*: InferenceX's "
                   f"ingest reads only such folders of its artifacts root, e.g. ARTIFACTS/{INFX_DIR_EXAMPLE} "
                   "(default: --out)")
    p.add_argument("--per-request", metavar="FILE.jsonl", action="append", default=[], type=Path,
                   help="infx: the run's --per-request file, for the ITL of every chunk gap (InferenceX's) instead of "
                   "the results' ITL histogram; once per results file, in their order")
    _add_identity_args(p)
    p.set_defaults(func=run)


def _add_identity_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "InferenceX identity (infx, agentx)",
        "Keys InferenceX files each row under. hw comes from the GPUs the run measured (its GPU "
        "telemetry's names, the in-process engine's device); runs against our server fill framework "
        "(agentload), precision (bf16), model prefix (its served model, if InferenceX knows it), tp "
        "(its GPU count: TP only) and spec decoding (its card); other servers need --framework, "
        "--precision and --model-prefix, and --hw where the run measured no GPU.")
    g.add_argument("--hw", default=_DEFAULTS.hw,
                   help="runner hardware, e.g. h200, b200-nv, mi355x (InferenceX GPU key): needed where the run "
                   "recorded no GPU's name; overrides the GPU measured, with a warning where they differ")
    g.add_argument("--framework", default=_DEFAULTS.framework, help="serving framework, e.g. vllm, sglang")
    g.add_argument("--precision", default=_DEFAULTS.precision, help="weights precision, e.g. fp8, fp4, bf16")
    g.add_argument("--model-prefix", default=_DEFAULTS.model_prefix,
                   help="InferenceX model prefix (infmax_model_prefix), e.g. dsv4, qwen3.5")
    g.add_argument("--image", default=_DEFAULTS.image,
                   help="serving container image (default: a recipe run's server.image, else empty)")
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
                   help="InferenceX recipe fingerprint (default: a recipe run's, else empty)")


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
    from loadgen.report.runs import load_runs
    from loadgen.report.terminal import format_report

    formats = parse_formats(args.format)
    runs = load_runs(args.results)
    out = Path(args.out) if args.out else runs[0].path.parent / "report"
    # before writing anything: a bad identity or folder fails first
    infx = _infx_rows(runs, formats, identity_flags(args), args.per_request)
    infx_dir = _infx_dir(args.infx_dir, out) if infx else None
    if "table" in formats:
        print(format_report(runs))
    written = []
    if infx_dir is not None:
        from loadgen.export.infx import write_rows

        infx_dir.mkdir(parents=True, exist_ok=True)
        written += [write_rows(rows, infx_dir / INFX_FORMATS[name]) for name, rows in infx.items()]
    if any(name in formats for name in REPORT_FORMATS if name != "table"):
        out.mkdir(parents=True, exist_ok=True)
    if "csv" in formats:
        from loadgen.export.levels_csv import write_csv

        written.append(write_csv(runs, out / "levels.csv"))
    plots = None
    if "png" in formats:
        from loadgen.report.plots import render_plots

        plots = render_plots(runs, out)
        written += [png for png, _ in plots]
    if "html" in formats:
        from loadgen.report.html import write_html

        written.append(write_html(runs, out / "report.html", plots))  # embeds the PNGs just written
    for path in written:
        print(f"wrote {path}")
    if infx_dir is not None:
        print(_where_ingest_reads(infx_dir, [INFX_FORMATS[name] for name in infx]))
    return 0


def _infx_rows(runs, formats: list[str], flags: IdentityFlags, per_request: list[Path]) -> dict[str, list]:
    from loadgen.errors import UsageError
    from loadgen.export.infx import agentx_rows, infx_rows
    from loadgen.export.infx_identity import ExportError

    try:
        return {name: infx_rows(runs, flags, per_request) if name == "infx" else agentx_rows(runs, flags)
                for name in INFX_FORMATS if name in formats}
    except ExportError as exc:
        raise UsageError(str(exc)) from exc


def _infx_dir(given: str | None, out: Path) -> Path:
    """The folder for the InferenceX rows: --infx-dir, named as one the ingest reads, else --out."""
    from loadgen.errors import UsageError

    if given is None:
        return out
    folder = Path(given)
    if not folder.name.startswith(INFX_DIR_PREFIXES):
        raise UsageError(f"--infx-dir {folder}: InferenceX's ingest reads only the *.json directly inside folders "
                         f"named {' or '.join(f'{prefix}*' for prefix in INFX_DIR_PREFIXES)}; name it so, e.g. "
                         f"{folder.parent / INFX_DIR_EXAMPLE}")
    return folder


def _where_ingest_reads(folder: Path, names: list[str]) -> str:
    """Where the rows must go for InferenceX's ingest to read them."""
    if folder.name.startswith(INFX_DIR_PREFIXES):
        return (f"InferenceX's ingest reads {folder.name}/*.json when the folder sits in its artifacts root: upload "
                f"{folder} as a workflow artifact named {folder.name}, or copy the folder into the one the ingest "
                "reads (INGEST_ARTIFACTS_PATH)")
    return (f"InferenceX's ingest reads only the *.json directly inside bmk_* and results_* folders of its artifacts "
            f"root, and {folder.name}/ is none: put {' and '.join(names)} in such a folder (a workflow artifact "
            f"named {INFX_DIR_EXAMPLE}, or INGEST_ARTIFACTS_PATH/{INFX_DIR_EXAMPLE}/), or write them there with "
            "--infx-dir")
