"""A/A false-verdict rate and planted-effect detection rate of `loadgen compare`'s methods.

Collect: our server with three variants - A, A2 (`control`, an identical copy of A) and B (A plus
`--step-delay-ms D`, D = 10 % of A's TPOT p50 measured in a pilot run unless --delay-ms is given)
- over --rounds rounds; round k runs A, A2 and B once each. Two layouts:

  recipe (default)  one recipe (loadgen/recipe): every run on a freshly started server, the same
                    seed in every run, rounds interleaved (A A2 B, A2 B A, B A A2, ...)
  --alternate       (a GPU's time is short) the three servers started once, side by side on one
                    device (each with --gpu-memory-fraction of its memory), then round k replays
                    seed + k against each in turn, the order rotated per round (A A2 B, A2 B A,
                    B A A2, ...); the fresh seed per round keeps a server's prefix cache from
                    holding the next round's prompts. --budget-s stops starting rounds in time;
                    run again on the same --out to add the missing rounds (finished ones are kept).

Analyse: comparisons are drawn round by round. An A/A comparison of n rounds takes a subset of
n rounds and, per round, one of its A/A2 runs as BASE and the other as NEW (every subset and
assignment is an A/A comparison; a "false verdict" is a better/worse verdict on a metric row). An
A/B comparison takes, per round, A or A2 as BASE and B as NEW; "detected" = TPOT p50 "worse".
Spike-in: every A/A comparison again with NEW's per-request TPOT made SPIKE_PCT (10) % longer -
an exactly known 10 % change on the real noise of identical runs, whatever the planted delay
turned out to do to TPOT on the day. Two kinds: TPOT alone (only the TPOT and interactivity rows
move), and a decode slowdown (each request's E2EL also grows by the added decode time, as a
slower decode step would make it; rates left as measured).
Methods (all with Benjamini-Hochberg at FDR 0.05 over the comparison's rows, except single/old):

  single/old      one run per side, session bootstrap, verdict when the 95 % interval excludes 0
                  (the method before the calibration work)
  single/bh       the same, plus Benjamini-Hochberg
  welch/n         n runs per side, Welch t on the logs of per-run values (`loadgen compare`
                  without --paired)
  paired/n        n rounds, t on the per-round log ratios of whole-run values (the runs'
                  request keys removed, so no matching)
  matched/n       `loadgen compare --paired`: per round, percentiles over the requests both runs
                  measured, t on the per-round log ratios
  block/n         matched, with the round's third run (B in an A/A comparison, the other of A/A2
                  in an A/B one) joining the residual variance (`--block`, a recipe's default
                  with three or more variants)
  matched-boot/n  the same per-round ratios, interval by a bootstrap over rounds (percentile,
                  RESAMPLES draws) instead of the t: the cluster bootstrap that the t replaces

Comparisons drawn from one set of runs share runs, so they are not independent: the report
gives the number of distinct runs beside every rate. Also writes run_noise.json (run-to-run SD in
% of each metric over the A and A2 runs) for `loadgen compare --run-noise`, and per metric the SD
of the A/A2 difference within a round with and without matching requests (what pairing and
matching remove).

  python benchmarks/ab_calibration.py --rounds 6 --duration 60 --out /tmp/abcal      # CPU tiny
  python benchmarks/ab_calibration.py --analyze /tmp/abcal                          # re-analyse
  python benchmarks/ab_calibration.py --model v32 --num-layers 4 --device cuda --token-scale 0.25 \\
      --think-time-scale 0.02 --think-time-cap 2 --conc 8 --duration 60 --rounds 5 --alternate \\
      --delay-ms 0.22 --budget-s 535 --server-cpus 0-7 --client-cpus 8-11 --collect-only --out /tmp/abcal-gpu
      # one H200, the default length: ~210 s per round of 60 s windows, 2 rounds per 10-minute
      # call; call again with the same --out (the folder carried) for the rest, then --analyze
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workload_flags import add_workload_flags

from loadgen.compare import benjamini_hochberg, compare_runs, verdict
from loadgen.compare.stats import LevelSample, group_levels, point_values
from loadgen.compare.verdicts import round_log_ratios
from loadgen.recipe.runner import RecipeRun, load_command, plan
from loadgen.recipe.schema import (
    CompareConfig,
    Recipe,
    ServerConfig,
    Sweep,
    Variant,
    Workload,
)
from loadgen.recipe.server import RunningServer
from loadgen.results.metric_registry import STATISTIC_BY_NAME, STATISTICS
from loadgen.run.affinity import placed_on

MAX_COMPARISONS = 120  # per method and size (drawn without repeats, seeded)
RESAMPLES = 2000  # matched-boot's bootstrap over rounds
SIZES = (3, 5)  # rounds per comparison for the repeats methods (those that fit in --rounds)
METHODS = ("welch", "paired", "matched", "block", "matched-boot")
SPIKE_PCT = 10.0  # the known TPOT change added to one side of every A/A comparison


def build_recipe(args: argparse.Namespace, delay_ms: float | None, rounds: int, name: str) -> Recipe:
    flags = [("model", args.model), ("device", args.device)]
    if args.num_layers:
        flags.append(("num_layers", args.num_layers))
    if args.alternate and args.device != "cpu":
        flags.append(("gpu_memory_utilization", args.gpu_memory_fraction))
    variants = [Variant("A")]
    if delay_ms is not None:
        variants += [Variant("A2", control=True), Variant("B", flags=(("step_delay_ms", round(delay_ms, 3)),))]
    return Recipe(
        name=name,
        server=ServerConfig(kind="ours", flags=tuple(flags), startup_timeout_s=600.0, cpus=args.server_cpus),
        workload=Workload(token_scale=args.token_scale, think_time_scale=args.think_time_scale,
                          think_time_cap=args.think_time_cap),
        sweep=Sweep(conc=(args.conc,), duration_s=args.duration, warmup=args.warmup, repeats=rounds, seed=3,
                    client_cpus=args.client_cpus, servers="kept" if args.alternate else "fresh"),
        variants=tuple(variants),
        compare=CompareConfig(),
    )


def collect(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    recipe = build_recipe(args, _delay(args, out), args.rounds, "abcal")
    RecipeRun(recipe, out / "runs-recipe", resume=(out / "runs-recipe" / "recipe.yaml").exists(),
              quiet=args.quiet).run()
    return out


def _delay(args: argparse.Namespace, out: Path) -> float:
    """--delay-ms, or 10 % of a pilot run's TPOT p50."""
    if args.delay_ms is not None:
        return args.delay_ms
    pilot = build_recipe(args, None, 1, "abcal-pilot")
    RecipeRun(pilot, out / "pilot", resume=(out / "pilot" / "recipe.yaml").exists(), quiet=args.quiet).run()
    tpot = _metric(json.loads((out / "pilot" / "runs" / "A-r1" / "result.json").read_text()), "tpot_p50")
    print(f"pilot: TPOT p50 {tpot:.2f} ms -> planted delay {0.10 * tpot:.2f} ms per step", flush=True)
    return 0.10 * tpot


def collect_alternate(args: argparse.Namespace) -> Path:
    """The three servers started once, side by side; round k replays seed + k on each in turn."""
    out = Path(args.out)
    began = time.monotonic()
    recipe = build_recipe(args, _delay(args, out), args.rounds, "abcal-alternate")
    folder = out / "alternate"
    folder.mkdir(parents=True, exist_ok=True)
    servers = [RunningServer(recipe, v, folder / f"server-{v.name}.log") for v in recipe.variants]
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.start(), servers))
        print(f"servers healthy after {time.monotonic() - began:.0f} s", flush=True)
        by_variant = {server.variant.name: server for server in servers}
        rounds = plan(recipe)  # the recipe runner's rotated order and run names
        round_s = 0.0
        for k in range(args.rounds):
            if time.monotonic() - began + round_s > args.budget_s:
                print(f"stopping after {k} rounds: the next would pass --budget-s {args.budget_s:g}", flush=True)
                break
            runs = rounds[k * len(servers):(k + 1) * len(servers)]  # round k + 1 replays its own seed
            if all((folder / run.name / "result.json").exists() for run in runs):
                continue  # finished by an earlier call: a device call's time limit splits the rounds
            started = time.monotonic()
            for run in runs:
                server = by_variant[run.variant.name]
                with placed_on(recipe.sweep.client_cpu_set()):
                    subprocess.run(load_command(recipe, run.variant, server.url, folder / run.name, True, run.round),
                                   check=True)
            round_s = time.monotonic() - started
            print(f"round {k + 1}: {round_s:.0f} s", flush=True)
    finally:
        for server in servers:
            server.stop()
    return out


def _rounds(out: Path) -> dict[str, list[dict]]:
    """Per variant, its results doc (first level only) of every round that all variants finished."""
    runs = out / "alternate" if (out / "alternate").exists() else out / "runs-recipe" / "runs"
    found: dict[str, dict[int, dict]] = {}
    for path in runs.glob("*-r*/result.json"):
        variant, k = path.parent.name.rsplit("-r", 1)
        doc = json.loads(path.read_text())
        if doc.get("status") == "complete":
            found.setdefault(variant, {})[int(k)] = dict(doc, levels=doc["levels"][:1], path=str(path))
    complete = sorted(set.intersection(*(set(v) for v in found.values())))
    return {variant: [by_round[k] for k in complete] for variant, by_round in found.items()}


def _samples(docs: list[dict], matched: bool = True) -> list[LevelSample]:
    samples = [next(iter(group_levels([(d["path"], d)]).values()))[0] for d in docs]
    return samples if matched else [dataclasses.replace(s, keys=None) for s in samples]


def _metric(doc: dict, name: str) -> float:
    sample = next(iter(group_levels([("x", doc)]).values()))[0]
    return float(point_values(sample, [STATISTIC_BY_NAME[name]])[0])


def analyze(out: Path) -> dict:
    rounds = _rounds(out)
    a, a2, b = rounds["A"], rounds["A2"], rounds["B"]
    rng = np.random.default_rng(0)
    pool = a + a2
    values = np.array([point_values(s, STATISTICS) for s in _samples(pool)])  # (runs, metrics)
    noise = {m.name: float(100.0 * np.std(np.log(values[:, i]), ddof=1)) for i, m in enumerate(STATISTICS)}
    (out / "run_noise.json").write_text(json.dumps({"run_noise_pct": noise, "runs": len(pool)}, indent=1))
    report: dict = {"rounds": len(a), "runs": {"A+A2 (identical)": len(pool), "B (planted delay)": len(b)},
                    "run_noise_pct": {k: round(v, 2) for k, v in noise.items()},
                    "within_round_aa_sd_pct": _within_round_sd(a, a2),
                    "planted_tpot_change_pct": _planted(a, a2, b), "methods": {}}
    plans = [("single/old", 1), ("single/bh", 1)]
    plans += [(f"{m}/{n}", n) for n in SIZES if n <= len(a) for m in METHODS]
    for method, n in plans:
        false = rows = aa = spiked = slowed = 0
        for subset, flips in _draws(len(a), n, null=True, rng=rng):
            base = [(a2 if f else a)[k] for k, f in zip(subset, flips)]
            new = [(a if f else a2)[k] for k, f in zip(subset, flips)]
            third = [b[k] for k in subset]
            verdicts = _verdicts(method, base, new, rng, third)
            false += sum(v in ("better", "worse") for v in verdicts.values())
            rows += len(verdicts)
            aa += 1
            spiked += _verdicts(method, base, [_spiked(d) for d in new], rng, third)["tpot_p50"] == "worse"
            slowed += _verdicts(method, base, [_spiked(d, True) for d in new], rng, third)["tpot_p50"] == "worse"
        detected = tries = 0
        for subset, flips in _draws(len(a), n, null=False, rng=rng):
            base = [(a2 if f else a)[k] for k, f in zip(subset, flips)]
            third = [(a if f else a2)[k] for k, f in zip(subset, flips)]
            detected += _verdicts(method, base, [b[k] for k in subset], rng, third)["tpot_p50"] == "worse"
            tries += 1
        report["methods"][method] = {
            "aa_comparisons": aa, "aa_metric_rows": rows,
            "aa_false_verdicts": false, "aa_false_verdict_rate": round(false / rows, 4) if rows else None,
            "ab_comparisons": tries, "tpot_detected": detected,
            "tpot_detection_rate": round(detected / tries, 4) if tries else None,
            f"spike_{SPIKE_PCT:g}pct_detected": spiked, f"spike_{SPIKE_PCT:g}pct_detection_rate": round(spiked / aa, 4),
            f"decode_spike_{SPIKE_PCT:g}pct_detected": slowed,
            f"decode_spike_{SPIKE_PCT:g}pct_detection_rate": round(slowed / aa, 4)}
    (out / "calibration.json").write_text(json.dumps(report, indent=1))
    return report


def _draws(rounds: int, n: int, null: bool, rng: np.random.Generator) -> list[tuple[tuple[int, ...], tuple]]:
    """(rounds subset, which of A/A2 is BASE per round) draws, at most MAX_COMPARISONS. A/A: the
    first round's assignment is fixed (swapping every round mirrors the comparison)."""
    draws = []
    for subset in itertools.combinations(range(rounds), n):
        free = n - 1 if null else n
        for pattern in itertools.product((False, True), repeat=free):
            draws.append((subset, ((False,) if null else ()) + pattern))
    if len(draws) > MAX_COMPARISONS:
        draws = [draws[i] for i in sorted(rng.choice(len(draws), MAX_COMPARISONS, replace=False))]
    return draws


def _verdicts(method: str, base: list[dict], new: list[dict], rng: np.random.Generator,
              third: list[dict]) -> dict:
    """{metric: verdict} of one comparison by `method`; `third`: the rounds' other run (block/n)."""
    name = method.split("/")[0]
    if name == "matched-boot":
        return _round_bootstrap(_samples(base), _samples(new), rng)
    if name == "paired":  # no request keys: whole-run percentiles
        base, new = ([_without_turns(d) for d in side] for side in (base, new))
    fdr = 0.999999 if method == "single/old" else 0.05  # BH at ~1: the interval alone decides
    comparison = compare_runs([(d["path"], d) for d in base], [(d["path"], d) for d in new], resamples=400,
                              fdr=fdr, paired=name in ("paired", "matched", "block"), seed=int(rng.integers(1 << 30)),
                              blocks=[[(d["path"], d) for d in third]] if name == "block" else ())
    return {r.metric.name: r.verdict for r in comparison.levels[0].results}


def _spiked(doc: dict, decode: bool = False) -> dict:
    """The run with every request's TPOT SPIKE_PCT % longer: a known effect on real A/A noise;
    `decode`: its E2EL longer by the added time of its output tokens after the first, too."""
    level = doc["levels"][0]
    requests, grow = level["requests"], SPIKE_PCT / 100
    changed = {"tpot_us": [None if v is None else v * (1 + grow) for v in requests["tpot_us"]]}
    if decode:
        changed["e2el_us"] = [e if e is None or t is None else e + grow * t * max(osl - 1, 0)
                              for e, t, osl in zip(requests["e2el_us"], requests["tpot_us"], requests["osl"])]
    return dict(doc, levels=[dict(level, requests=dict(requests, **changed))])


def _without_turns(doc: dict) -> dict:
    level = doc["levels"][0]
    requests = {k: v for k, v in level["requests"].items() if k != "turn"}
    return dict(doc, levels=[dict(level, requests=requests)])


def _round_bootstrap(base: list[LevelSample], new: list[LevelSample], rng: np.random.Generator) -> dict:
    ratios, _ = round_log_ratios(base, new, STATISTICS)
    draws = rng.integers(0, ratios.shape[1], size=(RESAMPLES, ratios.shape[1]))
    means = ratios[:, draws].mean(axis=2)  # (metrics, resamples)
    rows = []
    for i in range(len(STATISTICS)):
        boot = means[i][np.isfinite(means[i])]
        centre = float(np.nanmean(ratios[i]))
        low, high = np.percentile(boot, [2.5, 97.5])
        p = min(1.0, 2.0 * (min((boot <= 0).sum(), (boot >= 0).sum()) + 1) / (boot.size + 1))
        rows.append((100 * math.expm1(centre), (100 * math.expm1(low), 100 * math.expm1(high)), p))
    keep = benjamini_hochberg([p for *_, p in rows], 0.05)
    return {m.name: (verdict(m, d, ci) if keep[i] else "within noise") for i, (m, (d, ci, _)) in
            enumerate(zip(STATISTICS, rows))}


def _within_round_sd(a: list[dict], a2: list[dict]) -> dict:
    """Per metric, the SD (% of the value) of log(A2_k / A_k) over rounds, whole runs and over
    the requests both runs measured, divided by sqrt 2: one run's share of the pair's noise."""
    whole = round_log_ratios(_samples(a, matched=False), _samples(a2, matched=False), STATISTICS)[0]
    matched = round_log_ratios(_samples(a), _samples(a2), STATISTICS)[0]
    return {m.name: {"whole_runs": round(float(100 * np.std(whole[i], ddof=1) / math.sqrt(2)), 2),
                     "matched_requests": round(float(100 * np.std(matched[i], ddof=1) / math.sqrt(2)), 2)}
            for i, m in enumerate(STATISTICS) if len(a) >= 2}


def _planted(a: list[dict], a2: list[dict], b: list[dict]) -> dict:
    """TPOT p50 change of B against A and A2: ratio of means, and the geometric mean of per-round
    ratios over matched requests."""
    tpot = [STATISTIC_BY_NAME["tpot_p50"]]
    mean = {name: float(np.mean([point_values(s, tpot)[0] for s in _samples(runs)])) for name, runs in
            (("A", a + a2), ("B", b))}
    matched = np.concatenate([round_log_ratios(_samples(side), _samples(b), tpot)[0][0] for side in (a, a2)])
    return {"ratio_of_means_pct": round(100 * (mean["B"] / mean["A"] - 1), 2),
            "matched_geometric_pct": round(100 * math.expm1(float(np.nanmean(matched))), 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/abcal", help="results folder (default /tmp/abcal)")
    p.add_argument("--analyze", metavar="DIR", help="only analyse the runs already in DIR")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds of A, A2, B (default 6)")
    p.add_argument("--delay-ms", type=float, help="planted per-step delay (default: 10 %% of a pilot's TPOT p50)")
    p.add_argument("--num-layers", type=int)
    p.add_argument("--conc", type=int, default=2)
    p.add_argument("--duration", type=float, default=15.0, help="window per run, s (default 15, bench's tiny preset)")
    p.add_argument("--warmup", default="1req")
    add_workload_flags(p)
    p.add_argument("--server-cpus", metavar="LIST", help="CPUs of every server's processes (recipe server.cpus)")
    p.add_argument("--client-cpus", metavar="LIST", help="CPUs of the load generator (recipe sweep.client_cpus)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--alternate", action="store_true",
                   help="the three servers started once side by side, a fresh seed per round (cheap on a GPU)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.25,
                   help="--alternate on a GPU: each server's --gpu-memory-utilization (default 0.25)")
    p.add_argument("--budget-s", type=float, default=math.inf,
                   help="--alternate: start no round that would end later than this many seconds")
    p.add_argument("--collect-only", action="store_true",
                   help="run the rounds, skip the analysis (a device's time is short; --analyze later)")
    args = p.parse_args()
    if args.analyze:
        out = Path(args.analyze)
    else:
        out = collect_alternate(args) if args.alternate else collect(args)
        if args.collect_only:
            return 0
    print(json.dumps(analyze(out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
