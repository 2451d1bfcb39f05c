"""`loadgen compare BASE NEW`: per level and metric, both values, delta % and its 95 % interval,
and a verdict (better / worse / within noise); see loadgen/compare/verdicts.py for the method.

Exit codes: 0 compared (no gate tripped), 1 a `--fail-on-regression` gate tripped, 2 bad input
(missing or malformed file, wrong schema, unknown metric, no common level).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from loadgen.defaults import COMPARE
    from loadgen.results.metric_registry import STATISTICS

    p = subparsers.add_parser(
        "compare",
        help="compare two runs level by level with calibrated confidence intervals",
        description="Compare BASE and NEW results (agentload.result/1) level by level: for each "
        "metric both values, delta % = (NEW - BASE) / BASE, its 95 % confidence interval and a "
        "verdict: better, worse, or within noise. With repeats (>= 2 runs of a level per side) the "
        "interval is Welch's t on the per-run values (with --paired: a t on the per-round ratios, "
        "percentiles over the requests both runs of a round measured), which includes run-to-run noise; with one run "
        "per side it is a bootstrap over session plays (paired when both runs replayed the same "
        "plays), which does not, unless --run-noise gives it. A verdict needs the interval to "
        "exclude 0 and the change to survive Benjamini-Hochberg at --fdr over all compared rows.",
        epilog="A side is one results file or folder holding result.json, or several joined by "
        "commas: several runs of a level on a side are repeats. Metrics: "
        f"{', '.join(m.name for m in STATISTICS)}.",
    )
    p.add_argument("base", metavar="BASE", help="baseline results: FILE|DIR[,FILE|DIR...]")
    p.add_argument("new", metavar="NEW", help="new results: FILE|DIR[,FILE|DIR...]")
    p.add_argument("--metrics", metavar="M[,M...]", help="metrics to compare (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON (schema agentload.compare/1) instead of a table")
    p.add_argument("--fail-on-regression", action="append", default=[], metavar="METRIC:PCT",
                   help="exit 1 when NEW is worse than BASE on METRIC by more than PCT %% with the "
                   "interval excluding 0, at any common level (repeatable)")
    p.add_argument("--seed", type=int, default=COMPARE.seed, help=f"bootstrap seed (default {COMPARE.seed})")
    p.add_argument("--resamples", type=int, default=COMPARE.resamples, metavar="N",
                   help=f"bootstrap resamples (default {COMPARE.resamples})")
    p.add_argument("--min-effect", type=float, default=COMPARE.min_effect_pct, metavar="PCT",
                   help=f"also call |delta| below PCT %% within noise (default {COMPARE.min_effect_pct:g})")
    p.add_argument("--fdr", type=float, default=COMPARE.fdr, metavar="Q",
                   help=f"false-discovery rate of the Benjamini-Hochberg control over all (level, metric) "
                   f"rows (default {COMPARE.fdr:g})")
    p.add_argument("--run-noise", metavar="PCT|FILE.json",
                   help="the run-to-run standard deviation of identical runs in %% of each metric's value: "
                   "one number for all metrics (taken as exact), or run_noise.json as written by "
                   "benchmarks/ab_calibration.py (per metric, with the number of A/A runs it came from). "
                   "Pooled with the repeats' own variance; with one run per side it is the run-to-run "
                   "noise (default: none; a single-run comparison then says its interval lacks it)")
    p.add_argument("--paired", action="store_true",
                   help="the k-th run of a level on each side belong together (interleaved rounds A B A B, or "
                   "the k-th --repeat): a paired t on the per-round ratios, each percentile taken over the "
                   "requests both runs of the round measured; needs as many runs on each side (default: "
                   "unpaired Welch)")
    p.add_argument("--block", action="append", default=[], metavar="OTHER",
                   help="with --paired: another variant's runs of the same rounds (FILE|DIR[,...], as many "
                   "runs; repeatable); the rounds become blocks and every variant's residuals join the "
                   "variance, (rounds - 1) x (variants - 1) degrees of freedom instead of rounds - 1 "
                   "(what `loadgen recipe` does with three or more variants)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from loadgen.compare import (
        CompareError,
        compare_runs,
        format_comparison,
        regressions,
        to_json,
    )
    from loadgen.errors import UsageError
    from loadgen.report.runs import load_runs

    metrics, gates = _metrics_and_gates(args.metrics, args.fail_on_regression)
    run_noise = read_run_noise(args.run_noise)
    if args.min_effect < 0:
        raise UsageError(f"--min-effect: must be >= 0, got {args.min_effect:g}")
    base_paths, new_paths = _side(args.base, "BASE"), _side(args.new, "NEW")
    base, new = load_runs(base_paths), load_runs(new_paths)
    blocks = [[(r.name, r.doc) for r in load_runs(_side(text, "--block"))] for text in args.block]
    try:
        comparison = compare_runs([(r.name, r.doc) for r in base], [(r.name, r.doc) for r in new], metrics,
                                  args.resamples, args.seed, args.min_effect, args.fdr, run_noise, args.paired,
                                  blocks)
    except CompareError as exc:
        raise UsageError(str(exc)) from exc
    tripped = regressions(comparison, gates)
    if args.json:
        doc = to_json(comparison, [str(r.path) for r in base], [str(r.path) for r in new], tripped)
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_comparison(comparison, tripped))
    return 1 if tripped else 0


def read_run_noise(text: str | None):
    """--run-noise as a RunNoise (None when not given); UsageError naming the flag."""
    from loadgen.compare import CompareError
    from loadgen.compare.verdicts import load_run_noise
    from loadgen.errors import UsageError

    if text is None:
        return None
    try:
        return load_run_noise(text)
    except CompareError as exc:
        raise UsageError(str(exc)) from None


def _side(text: str, name: str) -> list[str]:
    from loadgen.errors import UsageError

    paths = [item.strip() for item in text.split(",") if item.strip()]
    if not paths:
        raise UsageError(f"{name}: expected a results file or folder, got {text!r}")
    return paths


def _metrics_and_gates(metrics_text: str | None, gate_texts: list[str]):
    """--metrics and --fail-on-regression checked against the known metric names; gated metrics
    are compared even when --metrics leaves them out."""
    from loadgen.compare import Gate
    from loadgen.errors import UsageError
    from loadgen.results.metric_registry import STATISTIC_BY_NAME, STATISTICS

    known = ", ".join(STATISTIC_BY_NAME)
    chosen = list(STATISTICS)
    if metrics_text:
        names = [name.strip() for name in metrics_text.split(",") if name.strip()]
        unknown = [name for name in names if name not in STATISTIC_BY_NAME]
        if unknown or not names:
            raise UsageError(f"--metrics: unknown metric {', '.join(unknown) or repr(metrics_text)}; known: {known}")
        chosen = [STATISTIC_BY_NAME[name] for name in dict.fromkeys(names)]
    gates = []
    for text in gate_texts:
        name, sep, pct = text.rpartition(":")
        try:
            value = float(pct)
        except ValueError:
            value = -1.0
        if not sep or value < 0:
            raise UsageError(f"--fail-on-regression: expected METRIC:PCT like e2el_p90:5, got {text!r}")
        if name not in STATISTIC_BY_NAME:
            raise UsageError(f"--fail-on-regression: unknown metric {name!r}; known: {known}")
        gates.append(Gate(name, value))
        if STATISTIC_BY_NAME[name] not in chosen:
            chosen.append(STATISTIC_BY_NAME[name])
    return chosen, gates
