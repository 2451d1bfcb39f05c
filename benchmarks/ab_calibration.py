"""A/A false-verdict rate and planted-effect detection rate of `loadgen compare`'s methods.

Collect: one recipe (loadgen/recipe) on our server with three variants - A, A2 (`control`, an
identical copy of A) and B (A plus `--step-delay-ms D`, D = 10 % of A's TPOT p50 measured in a
pilot run unless --delay-ms is given) - over --rounds interleaved rounds (A A2 B A A2 B ...),
every run on a freshly started server with the same seed.

Analyse: A and A2 runs form a pool of identical runs. For each method, every A/A comparison is a
comparison of two disjoint draws from that pool; a "false verdict" is a better/worse verdict
on any metric row. Detection: draws of A runs against draws of B runs; "detected" = TPOT p50
"worse". Methods:

  single/old      one run per side, session bootstrap, verdict when the 95 % interval excludes 0
                  (the method before the calibration work; no multiple-comparison control)
  single/bh       the same, plus Benjamini-Hochberg at FDR 0.05 over the comparison
  single/prior    one run per side, the run-to-run SD per metric learned from the OTHER half of
                  the pool (never in-sample) as the interval's variance, plus BH
  repeats/N       N runs per side (disjoint), Welch t on per-run logs, plus BH (the default)
  repeats/N+prior the same, the runs' variance pooled with the SD from the other half

Pairs drawn from one pool share runs, so they are not independent; the script reports the
number of distinct runs beside every rate. Also writes run_noise.json (run-to-run SD in % of
each metric over the pool) for `loadgen compare --run-noise`, and variance.json: the SD of each
metric over A runs in run order, so drift and warm-up effects can be seen.

  python benchmarks/ab_calibration.py --rounds 6 --out /tmp/abcal            # CPU tiny
  python benchmarks/ab_calibration.py --analyze /tmp/abcal                   # re-analyse
  python benchmarks/ab_calibration.py --model v32 --num-layers 4 --device cuda --token-scale 0.25 \\
      --think-time-scale 0.02 --think-time-cap 2 --conc 8 --duration 15 --rounds 4 --consecutive --out /tmp/abcal-gpu
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadgen.compare import METRICS, RunNoise, compare_runs
from loadgen.compare.stats import group_levels, point_values
from loadgen.recipe.runner import RecipeRun
from loadgen.recipe.schema import (
    CompareSpec,
    Recipe,
    ServerSpec,
    Sweep,
    Variant,
    Workload,
)

MAX_PAIRS = 120  # comparisons per method (drawn without repeats, seeded)


def build_recipe(args: argparse.Namespace, delay_ms: float | None, rounds: int, name: str) -> Recipe:
    flags = [("model", args.model), ("device", args.device)]
    if args.num_layers:
        flags.append(("num_layers", args.num_layers))
    variants = [Variant("A")]
    if delay_ms is not None:
        variants += [Variant("A2", control=True), Variant("B", flags=(("step_delay_ms", round(delay_ms, 3)),))]
    return Recipe(
        name=name,
        server=ServerSpec(kind="ours", flags=tuple(flags), startup_timeout_s=600.0),
        workload=Workload(token_scale=args.token_scale, think_time_scale=args.think_time_scale,
                          think_time_cap=args.think_time_cap),
        sweep=Sweep(conc=(args.conc,), duration_s=args.duration, warmup=args.warmup, repeats=rounds, seed=3),
        variants=tuple(variants),
        compare=CompareSpec(),
    )


def collect(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    delay = args.delay_ms
    if delay is None:
        pilot = build_recipe(args, None, 1, "abcal-pilot")
        RecipeRun(pilot, out / "pilot", resume=(out / "pilot" / "recipe.yaml").exists(), quiet=args.quiet).run()
        tpot = _metric(_docs(out / "pilot" / "runs", "A")[0], "tpot_p50")
        delay = 0.10 * tpot
        print(f"pilot: TPOT p50 {tpot:.2f} ms -> planted delay {delay:.2f} ms per step", flush=True)
    recipe = build_recipe(args, delay, args.rounds, "abcal")
    RecipeRun(recipe, out / "runs-recipe", resume=(out / "runs-recipe" / "recipe.yaml").exists(),
              quiet=args.quiet).run()
    return out


def _docs(runs: Path, variant: str) -> list[dict]:
    files = sorted(runs.glob(f"{variant}-r*/result.json"), key=lambda p: int(p.parent.name.rsplit("-r", 1)[1]))
    return [json.loads(f.read_text()) for f in files]


def _metric(doc: dict, name: str) -> float:
    sample = next(iter(group_levels([("x", doc)]).values()))[0]
    return float(point_values(sample, [m for m in METRICS if m.name == name])[0])


def collect_consecutive(args: argparse.Namespace) -> Path:
    """The cheap layout (a GPU's time is short): one server for A running --rounds x 2 repeats in a
    row, then one for B (delay = 10 % of A's mean TPOT p50) running --rounds repeats. It misses
    the variance between server starts, which the recipe layout includes."""
    import subprocess

    from loadgen.recipe.runner import load_command
    from loadgen.recipe.server import RunningServer

    out = Path(args.out)
    recipe = build_recipe(args, 0.0, 1, "abcal-consecutive")
    delay = args.delay_ms
    for variant, repeats in ((recipe.variants[0], 2 * args.rounds), (recipe.variants[2], args.rounds)):
        if variant.name == "B":
            if delay is None:
                delay = 0.10 * float(np.mean([_metric(d, "tpot_p50") for d in _split(out / "consecutive" / "A")]))
            variant = Variant("B", flags=(("step_delay_ms", round(delay, 3)),))
            print(f"planted delay {delay:.2f} ms per step", flush=True)
        folder = out / "consecutive" / variant.name
        folder.mkdir(parents=True, exist_ok=True)
        server = RunningServer(recipe, variant, folder / "server.log")
        server.start()
        try:
            command = load_command(recipe, variant, server.url, folder, args.quiet) + ["--repeat", str(repeats)]
            subprocess.run(command, check=True)
        finally:
            server.stop()
    return out


def _split(folder: Path) -> list[dict]:
    """A --repeat results file as one doc per repeat."""
    whole = json.loads((folder / "result.json").read_text())
    return [dict(whole, levels=[level]) for level in whole["levels"]]


def analyze(out: Path) -> dict:
    if (out / "consecutive").exists():
        pool, slow = _split(out / "consecutive" / "A"), _split(out / "consecutive" / "B")
    else:
        runs = out / "runs-recipe" / "runs"
        pool, slow = _docs(runs, "A") + _docs(runs, "A2"), _docs(runs, "B")
    rng = np.random.default_rng(0)
    values = np.array([[_metric(d, m.name) for m in METRICS] for d in pool])  # (runs, metrics)
    noise = {m.name: float(100.0 * np.std(np.log(values[:, i]), ddof=1)) for i, m in enumerate(METRICS)}
    (out / "run_noise.json").write_text(json.dumps({"run_noise_pct": noise, "runs": len(pool)}, indent=1))
    report = {"runs": {"A+A2 (identical)": len(pool), "B (planted delay)": len(slow)},
              "run_noise_pct": {k: round(v, 2) for k, v in noise.items()}, "methods": {}}
    half = len(pool) // 2
    for method in ("single/old", "single/bh", "single/prior", "repeats/2", "repeats/3", "repeats/3+prior",
                   "repeats/2+prior"):
        false, rows, aa_pairs = 0, 0, 0
        for a, b in _null_pairs(len(pool), method, rng):
            comparison = _compare(method, [pool[i] for i in a], [pool[i] for i in b], pool, a + b, half)
            verdicts = [r.verdict for lv in comparison.levels for r in lv.results]
            false += sum(v in ("better", "worse") for v in verdicts)
            rows += len(verdicts)
            aa_pairs += 1
        detected, tries = 0, 0
        for a, b in _ab_pairs(len(pool), len(slow), method, rng):
            comparison = _compare(method, [pool[i] for i in a], [slow[i] for i in b], pool, a, half)
            tpot = next(r for r in comparison.levels[0].results if r.metric.name == "tpot_p50")
            detected += tpot.verdict == "worse"
            tries += 1
        report["methods"][method] = {
            "aa_comparisons": aa_pairs, "aa_metric_rows": rows,
            "aa_false_verdict_rate": round(false / rows, 4) if rows else None,
            "ab_comparisons": tries, "tpot_detection_rate": round(detected / tries, 4) if tries else None}
    tpot_a = np.mean([_metric(d, "tpot_p50") for d in pool])
    tpot_b = np.mean([_metric(d, "tpot_p50") for d in slow]) if slow else math.nan
    report["planted_tpot_change_pct"] = round(100.0 * (tpot_b / tpot_a - 1.0), 2)
    report["variance"] = _variance(values)
    (out / "calibration.json").write_text(json.dumps(report, indent=1))
    return report


def _size(method: str) -> int:
    return 1 if method.startswith("single") else int(method.split("/")[1].split("+")[0])


def _null_pairs(n: int, method: str, rng: np.random.Generator):
    size = _size(method)
    halves = (list(range(n // 2)), list(range(n // 2, n)))
    if method.endswith("prior"):  # the prior comes from the other half: both sides within one half
        pairs = []
        for h in halves:
            if size == 1:
                pairs += [([i], [j]) for i, j in itertools.combinations(h, 2)]
            elif len(h) >= 2 * size:
                for _ in range(MAX_PAIRS // 2):
                    pick = rng.permutation(h)[: 2 * size].tolist()
                    pairs.append((pick[:size], pick[size:]))
    elif size == 1:
        pairs = [([i], [j]) for i, j in itertools.combinations(range(n), 2)]
    else:
        pairs = []
        for _ in range(MAX_PAIRS):
            pick = rng.permutation(n)[: 2 * size].tolist()
            pairs.append((pick[:size], pick[size:]))
    rng.shuffle(pairs)
    return pairs[:MAX_PAIRS]


def _ab_pairs(n: int, m: int, method: str, rng: np.random.Generator):
    size = _size(method)
    if size > m or size > n:
        return []
    if size == 1:
        pairs = [([i], [j]) for i in range(n) for j in range(m)]
        rng.shuffle(pairs)
        return pairs[:MAX_PAIRS]
    return [(rng.permutation(n)[:size].tolist(), rng.permutation(m)[:size].tolist()) for _ in range(MAX_PAIRS)]


def _compare(method: str, base: list[dict], new: list[dict], pool: list[dict], used: list[int], half: int):
    sides = ([(f"b{i}", d) for i, d in enumerate(base)], [(f"n{i}", d) for i, d in enumerate(new)])
    if method == "single/old":
        return compare_runs(*sides, resamples=400, fdr=0.999999)  # BH at ~1: the interval alone decides
    if method.endswith("prior"):
        other = [d for i, d in enumerate(pool) if (i < half) != (used[0] < half)]
        values = np.array([[_metric(d, m.name) for m in METRICS] for d in other])
        noise = {m.name: float(100.0 * np.std(np.log(values[:, i]), ddof=1)) for i, m in enumerate(METRICS)}
        return compare_runs(*sides, resamples=400, run_noise=RunNoise(noise, len(other)))
    return compare_runs(*sides, resamples=400)


def _variance(values: np.ndarray) -> dict:
    """Per metric: SD in % over identical runs, and the correlation of the value with run order
    (drift, warm-up of the machine)."""
    order = np.arange(len(values))
    out = {}
    for i, m in enumerate(METRICS):
        logs = np.log(values[:, i])
        out[m.name] = {"sd_pct": round(float(100 * logs.std(ddof=1)), 2),
                       "corr_with_run_order": round(float(np.corrcoef(order, logs)[0, 1]), 2)}
    return out


SOURCE_METRICS = ("tpot_p50", "ttft_p50", "e2el_p90", "output_tput_per_gpu")


def sources(args: argparse.Namespace) -> dict:
    """Where identical runs' variance comes from: SD over runs that differ in one thing each.
    fresh/same seed: the recipe's A runs (a new server per run, seed 3); one server/consecutive:
    `--repeat N` against one server (warm prefix cache and allocator carried over);
    fresh/seed differs: a new server per run and a different load seed (session mix, offsets)."""
    import dataclasses
    import subprocess

    from loadgen.recipe.runner import load_command
    from loadgen.recipe.server import RunningServer

    out = Path(args.out) / "sources"
    out.mkdir(parents=True, exist_ok=True)
    recipe = build_recipe(args, None, 1, "sources")
    n = args.source_runs
    docs: dict[str, list[dict]] = {"fresh server, same seed": _docs(Path(args.out) / "runs-recipe" / "runs", "A")}
    server = RunningServer(recipe, recipe.baseline, out / "server-consecutive.log")
    server.start()
    try:
        command = load_command(recipe, recipe.baseline, server.url, out / "consecutive", True) + ["--repeat", str(n)]
        subprocess.run(command, check=True)
    finally:
        server.stop()
    docs["one server, consecutive"] = _split(out / "consecutive")
    docs["fresh server, seed differs"] = []
    for seed in range(n):
        seeded = dataclasses.replace(recipe, sweep=dataclasses.replace(recipe.sweep, seed=100 + seed))
        server = RunningServer(seeded, seeded.baseline, out / f"server-seed{seed}.log")
        server.start()
        try:
            subprocess.run(load_command(seeded, seeded.baseline, server.url, out / f"seed{seed}", True), check=True)
        finally:
            server.stop()
        docs["fresh server, seed differs"].append(json.loads((out / f"seed{seed}" / "result.json").read_text()))
    table = {}
    for name, runs in docs.items():
        table[name] = {"runs": len(runs)}
        for metric in SOURCE_METRICS:
            logs = np.log([_metric(d, metric) for d in runs])
            table[name][metric] = round(float(100 * logs.std(ddof=1)), 2)
    (Path(args.out) / "sources.json").write_text(json.dumps(table, indent=1))
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/abcal", help="results folder (default /tmp/abcal)")
    p.add_argument("--analyze", metavar="DIR", help="only analyse the runs already in DIR")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds of A, A2, B (default 6)")
    p.add_argument("--delay-ms", type=float, help="planted per-step delay (default: 10 %% of a pilot's TPOT p50)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--num-layers", type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--conc", type=int, default=2)
    p.add_argument("--duration", type=float, default=15.0, help="window per run, s (default 15, bench's tiny preset)")
    p.add_argument("--warmup", default="1req")
    p.add_argument("--token-scale", type=float, default=0.02)
    p.add_argument("--think-time-scale", type=float, default=0.01)
    p.add_argument("--think-time-cap", type=float, default=1.0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--consecutive", action="store_true",
                   help="one server per variant, repeats in a row (cheap; misses restart-to-restart variance)")
    p.add_argument("--sources", action="store_true",
                   help="after collecting (or with --analyze DIR as --out), also measure variance sources")
    p.add_argument("--source-runs", type=int, default=6, help="runs per variance-source condition (default 6)")
    args = p.parse_args()
    if args.sources and args.analyze:
        args.out = args.analyze
        print(json.dumps(sources(args), indent=1))
        return 0
    if args.analyze:
        out = Path(args.analyze)
    else:
        out = collect_consecutive(args) if args.consecutive else collect(args)
    report = analyze(out)
    print(json.dumps({k: v for k, v in report.items() if k != "variance"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
