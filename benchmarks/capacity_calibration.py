"""A/A false-verdict rate and planted-change detection of capacity verdicts (`sweep.capacity` in a
recipe; loadgen/compare/capacity.py), as benchmarks/ab_calibration.py measures the latency ones.

Collect: one capacity recipe (loadgen/recipe) with three variants of our server - A, A2 (`control`,
an identical copy of A) and B (A plus `--step-delay-ms D`) - every variant's server started once
(`sweep.servers: kept`, so round k replays seed + k - 1 on each), rounds in the runner's Williams
orders. Each run is one `loadgen capacity` search under the SLO. D is --delay-ms, or chosen by a
pilot: one recipe of A and one B per --pilot-delays candidate, --pilot-rounds rounds, and D the
smallest candidate whose capacity came out at least CHANGE_PCT (15) % below A's (geometric mean
over the pilot's rounds); pilot.json keeps the choice. --budget-s stops the recipe (SIGINT, as
Ctrl-C: finished runs are kept) at the end of the first round after which another round would pass
the budget, counted from the script's start; run again with the same --out and --rounds to add the
missing rounds (`loadgen recipe run --resume`). The load average is sampled every LOAD_EVERY_S
seconds meanwhile (load.json): other processes on the host share its cores.

Analyse (the rounds that every variant finished): an A/A comparison of n rounds (n = 3 ..
rounds) takes a subset of n rounds and, per round, one of its A/A2 runs as BASE and the other as
NEW; a "false verdict" is "better" or "worse" on identical configurations. Two designs, as a
recipe draws them: paired (`compare_capacities(base, new)`, a two-variant recipe) and blocks of
three (the subset's B runs as `others`, a recipe with three variants). Detection: per subset, B
against A and B against A2 (blocks: the other of A/A2 as `others`); "detected" = "worse". Spike-in:
every A/A comparison again with NEW's capacity exactly CHANGE_PCT % lower - a known loss on the real
noise of identical runs, whatever the planted delay did to B's capacity on the day. Every
subset and assignment is drawn when they number at most MAX_COMPARISONS per size, else that many
distinct ones at random (seeded). Comparisons drawn from one set of runs share runs, so they are
not independent: the report gives the number of distinct runs beside every rate. Also reports
each run's capacity, the A/A spread (SD of log capacity over the A and A2 runs, and within a
round), the search's quantisation alone, and B's mean change. Writes capacity_calibration.json.

    python benchmarks/capacity_calibration.py --rounds 14 --budget-s 2700 --out /tmp/capcal   # CPU tiny
    python benchmarks/capacity_calibration.py --analyze /tmp/capcal                          # re-analyse
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workload_flags import add_workload_flags

from loadgen.compare.capacity import capacity_of, compare_capacities
from loadgen.recipe.schema import CapacityMeasure, Recipe, ServerConfig, Sweep, Variant, Workload, to_yaml

CHANGE_PCT = 15.0  # the capacity loss the planted delay must cause (issue 38's target)
MAX_COMPARISONS = 200  # per design and size (distinct draws, seeded)
LOAD_EVERY_S = 30.0
POLL_S = 2.0  # how often the recipe's runs folder is looked at for finished rounds
DESIGNS = ("paired", "block")
VARIANTS = ("A", "A2", "B")


def build_recipe(args: argparse.Namespace, name: str, variants: tuple[Variant, ...], rounds: int) -> Recipe:
    return Recipe(
        name=name,
        server=ServerConfig(kind="ours", flags=(("model", args.model), ("device", args.device)),
                          startup_timeout_s=600.0, cpus=args.server_cpus),
        workload=Workload(token_scale=args.token_scale, think_time_scale=args.think_time_scale,
                          think_time_cap=args.think_time_cap),
        sweep=Sweep(capacity=CapacityMeasure(slo=args.slo), duration_s=args.duration, warmup=args.warmup,
                    repeats=rounds, seed=args.seed, client_cpus=args.client_cpus, servers="kept"),
        variants=variants,
    )


def delayed(name: str, delay_ms: float) -> Variant:
    return Variant(name, flags=(("step_delay_ms", delay_ms),))


def run_recipe(recipe: Recipe, out: Path, folder: str, quiet: bool, stop_at: float = math.inf) -> None:
    """`loadgen recipe run` of `recipe` into out/folder (resumed when it was started before). At the
    end of a round after which another would end past `stop_at` (time.monotonic()), the recipe is
    interrupted as Ctrl-C would: the next round's partial run is discarded, finished ones kept."""
    path = out / f"{recipe.name}.yaml"
    path.write_text(to_yaml(recipe))
    runs = out / folder
    command = [sys.executable, "-m", "loadgen.cli", "recipe", "run", str(path), "--out", str(runs)]
    command += ["--resume"] * (runs / "recipe.yaml").exists() + ["--quiet"] * quiet
    names = [[f"{v.name}-r{k}" for v in recipe.variants] for k in range(1, recipe.sweep.repeats + 1)]
    # the rounds the runner will run (or finish): it skips a run whose result.json says "complete"
    left = [r for r in names if not all(_complete(runs / "runs" / name / "result.json") for name in r)]
    # its own session: a Ctrl-C here reaches the recipe once, through the finally below (a second
    # SIGINT would cut short its stopping of the servers)
    process = subprocess.Popen(command, start_new_session=True)
    began = boundary = time.monotonic()
    load_at, interrupted = -math.inf, False
    try:
        while process.poll() is None:
            time.sleep(POLL_S)
            now = time.monotonic()
            if now - load_at >= LOAD_EVERY_S:
                _log_load(out, recipe.name)
                load_at = now
            # A round is over when the runner starts the next round's first run (it runs them in
            # order and stops at a run that fails); a result.json cannot tell, as it says "complete"
            # from the search's first probe on.
            while len(left) > 1 and any((runs / "runs" / name).exists() for name in left[1]):
                left.pop(0)
                round_s, boundary = now - boundary, now
                print(f"capacity calibration: a round finished after {round_s:.0f} s "
                      f"({now - began:.0f} s into this call; {len(left)} left)", flush=True)
                if now + round_s > stop_at:
                    print(f"capacity calibration: stopping before the next round: it would pass --budget-s; "
                          f"run again with the same --out to add the {len(left)} round(s) left", flush=True)
                    process.send_signal(signal.SIGINT)
                    interrupted, left = True, []
    finally:
        if process.poll() is None and not interrupted:  # the recipe stops its servers on the way out
            process.send_signal(signal.SIGINT)
        code = process.wait()
    if code not in (0, 1, 130):  # 1: some probe's SLO failed even at the lightest load, still a capacity run
        raise SystemExit(f"capacity calibration: `{' '.join(command)}` exited {code}")


def _complete(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        return json.loads(path.read_bytes()).get("status") == "complete"
    except ValueError:  # being written
        return False


def _log_load(out: Path, stage: str) -> None:
    with open(out / "load.json", "a") as sink:
        sink.write(json.dumps({"t": round(time.time(), 1), "stage": stage, "load1": os.getloadavg()[0]}) + "\n")


def choose_delay(args: argparse.Namespace, out: Path, stop_at: float) -> float:
    """--delay-ms, the pilot's earlier choice (pilot.json), or a pilot's: the smallest candidate
    delay whose capacity is at least CHANGE_PCT % below A's."""
    if args.delay_ms is not None:
        return args.delay_ms
    saved = out / "pilot.json"
    if saved.exists():
        return json.loads(saved.read_text())["delay_ms"]
    delays = [float(d) for d in args.pilot_delays.split(",")]
    variants = (Variant("A"), *(delayed(f"B{d:g}", d) for d in delays))
    run_recipe(build_recipe(args, "capcal-pilot", variants, args.pilot_rounds), out, "pilot", args.quiet, stop_at)
    found = load_capacities(out / "pilot" / "runs")
    rounds = sorted(set.intersection(*(set(found.get(v.name, {})) for v in variants)))
    base = _log_capacities(found["A"], rounds)
    pilot: dict = {"rounds": len(rounds), "capacity": {v.name: [capacity_of(found[v.name][k]) for k in rounds]
                                                       for v in variants}, "change_pct": {}}
    for d in delays:
        change = float(np.nanmean(_log_capacities(found[f"B{d:g}"], rounds) - base))
        pilot["change_pct"][f"{d:g}"] = round(100.0 * math.expm1(change), 1) if math.isfinite(change) else None
    chosen = [d for d in delays if (pilot["change_pct"][f"{d:g}"] or 0.0) <= -CHANGE_PCT]
    print(f"pilot ({len(rounds)} round(s)): capacities {pilot['capacity']}; change against A, %: "
          f"{pilot['change_pct']}", flush=True)
    if not chosen:
        raise SystemExit(f"pilot: no candidate delay lowered the capacity by {CHANGE_PCT:g} %; give larger "
                         "--pilot-delays or --delay-ms")
    pilot["delay_ms"] = min(chosen)
    saved.write_text(json.dumps(pilot, indent=1))
    print(f"pilot: planted delay {pilot['delay_ms']:g} ms per step", flush=True)
    return pilot["delay_ms"]


def collect(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stop_at = time.monotonic() + args.budget_s
    delay = choose_delay(args, out, stop_at)
    variants = (Variant("A"), Variant("A2", control=True), delayed("B", delay))
    run_recipe(build_recipe(args, "capcal", variants, args.rounds), out, "runs-recipe", args.quiet, stop_at)
    return out


def load_capacities(runs: Path) -> dict[str, dict[int, dict]]:
    """Per variant, {round: a results document holding only the run's `capacity` block} of every
    finished run (what compare_capacities reads)."""
    found: dict[str, dict[int, dict]] = {}
    for path in runs.glob("*-r*/result.json"):
        variant, k = path.parent.name.rsplit("-r", 1)
        doc = json.loads(path.read_bytes())
        if doc.get("status") == "complete":
            found.setdefault(variant, {})[int(k)] = {"capacity": doc.get("capacity")}
    return found


def _log_capacities(by_round: dict[int, dict], rounds: list[int]) -> np.ndarray:
    values = [capacity_of(by_round[k]) for k in rounds]
    return np.array([math.log(c) if c else math.nan for c in values])


def draws(rounds: int, n: int, assign: bool, rng: np.random.Generator) -> list[tuple[tuple[int, ...], tuple]]:
    """(subset of n rounds, per round whether A2 is BASE) pairs; `assign` False: subsets alone. An A/A
    comparison's first round keeps A as BASE: swapping every round mirrors a comparison (better and
    worse trade places, the count of false verdicts stays). Every draw when they number at most
    MAX_COMPARISONS, else that many distinct ones at random."""
    free = n - 1 if assign else 0
    if math.comb(rounds, n) * 2 ** free <= MAX_COMPARISONS:
        return [(subset, (False,) * assign + pattern) for subset in itertools.combinations(range(rounds), n)
                for pattern in itertools.product((False, True), repeat=free)]
    seen: set[tuple[tuple[int, ...], tuple]] = set()
    while len(seen) < MAX_COMPARISONS:
        subset = tuple(sorted(int(k) for k in rng.choice(rounds, n, replace=False)))
        seen.add((subset, (False,) * assign + tuple(bool(f) for f in rng.integers(0, 2, free))))
    return sorted(seen)


def analyze(out: Path) -> dict:
    found = load_capacities(out / "runs-recipe" / "runs")
    rounds = sorted(set.intersection(*(set(found.get(v, {})) for v in VARIANTS)))
    if len(rounds) < 3:
        raise SystemExit(f"{out}: {len(rounds)} round(s) finished by every variant; the analysis needs 3")
    a, a2, b = ([found[v][k] for k in rounds] for v in VARIANTS)
    logs = {v: _log_capacities(found[v], rounds) for v in VARIANTS}
    first = next(d["capacity"] for d in a if d.get("capacity"))
    pilot = out / "pilot.json"
    report: dict = {
        "rounds": len(rounds), "runs": {v: len(rounds) for v in VARIANTS},
        "slo": first["slo"], "unit": first["unit"], "resolution": first.get("resolution"),
        "pilot": json.loads(pilot.read_text()) if pilot.exists() else None,
        "capacity": {v: [capacity_of(d) for d in docs] for v, docs in zip(VARIANTS, (a, a2, b))},
        "spread": _spread(logs), "planted_change_pct": _planted(logs),
        "all_rounds": {"A2 vs A (paired)": compare_capacities(a, a2).to_dict(),
                       "A2 vs A (block)": compare_capacities(a, a2, [b]).to_dict(),
                       "B vs A (paired)": compare_capacities(a, b).to_dict(),
                       "B vs A (block)": compare_capacities(a, b, [a2]).to_dict()},
        "by_size": {}, "load": _load_summary(out),
    }
    rng = np.random.default_rng(0)
    totals = {design: dict.fromkeys(("aa", "aa_false", "aa_na", "spike_worse", "ab", "ab_worse"), 0)
              for design in DESIGNS}
    for n in range(3, len(rounds) + 1):
        counts = {design: dict.fromkeys(totals[design], 0) for design in DESIGNS}
        for subset, flips in draws(len(rounds), n, True, rng):
            base = [(a2 if f else a)[k] for k, f in zip(subset, flips)]
            new = [(a if f else a2)[k] for k, f in zip(subset, flips)]
            for design, others in (("paired", []), ("block", [[b[k] for k in subset]])):
                verdict = compare_capacities(base, new, others).verdict
                counts[design]["aa"] += 1
                counts[design]["aa_false"] += verdict in ("better", "worse")
                counts[design]["aa_na"] += verdict == "n/a"
                counts[design]["spike_worse"] += compare_capacities(base, [_spiked(d) for d in new],
                                                                    others).verdict == "worse"
        for subset, _ in draws(len(rounds), n, False, rng):
            for ref, other in ((a, a2), (a2, a)):
                planted = [b[k] for k in subset]
                for design, others in (("paired", []), ("block", [[other[k] for k in subset]])):
                    counts[design]["ab"] += 1
                    counts[design]["ab_worse"] += compare_capacities([ref[k] for k in subset], planted,
                                                                     others).verdict == "worse"
        report["by_size"][n] = {design: _rates(c) for design, c in counts.items()}
        for design in DESIGNS:
            for key, value in counts[design].items():
                totals[design][key] += value
    report["pooled"] = {design: _rates(c) for design, c in totals.items()}
    (out / "capacity_calibration.json").write_text(json.dumps(report, indent=1))
    return report


def _spiked(doc: dict) -> dict:
    """The run with its capacity exactly CHANGE_PCT % lower: a known loss on real A/A noise, whatever
    the planted delay did to B's capacity on the day."""
    found = capacity_of(doc)
    return doc if found is None else {"capacity": dict(doc["capacity"], capacity=found * (1 - CHANGE_PCT / 100))}


def _rates(counts: dict[str, int]) -> dict:
    def rate(hits: int, total: int) -> float | None:
        return round(hits / total, 4) if total else None

    return {**counts, "aa_false_rate": rate(counts["aa_false"], counts["aa"]),
            "spike_worse_rate": rate(counts["spike_worse"], counts["aa"]),
            "ab_worse_rate": rate(counts["ab_worse"], counts["ab"])}


def _spread(logs: dict[str, np.ndarray]) -> dict:
    """The A/A run-to-run SD of log capacity in % (all A and A2 runs; and one run's share of the
    within-round A/A2 difference, which leaves out what a round shares)."""
    pool = np.concatenate([logs["A"], logs["A2"]])
    pool = pool[np.isfinite(pool)]
    diff = logs["A2"] - logs["A"]
    diff = diff[np.isfinite(diff)]
    return {"aa_runs_sd_log_pct": round(float(100.0 * np.std(pool, ddof=1)), 2) if pool.size > 1 else None,
            "within_round_sd_log_pct": round(float(100.0 * np.std(diff, ddof=1) / math.sqrt(2)), 2)
            if diff.size > 1 else None,
            "rounds_a_equals_a2": int((diff == 0).sum()), "rounds_compared": int(diff.size)}


def _planted(logs: dict[str, np.ndarray]) -> dict:
    """B's change: geometric mean of the per-round ratios to A and to A2, and the ratio of the means."""
    def geometric(ref: str) -> float:
        return round(100.0 * math.expm1(float(np.nanmean(logs["B"] - logs[ref]))), 2)

    plain = {v: np.exp(logs[v][np.isfinite(logs[v])]) for v in VARIANTS}
    return {"B_vs_A_geometric": geometric("A"), "B_vs_A2_geometric": geometric("A2"),
            "ratio_of_means": round(100.0 * (plain["B"].mean() / np.concatenate([plain["A"], plain["A2"]]).mean()
                                             - 1.0), 2)}


def _load_summary(out: Path) -> dict | None:
    path = out / "load.json"
    if not path.exists():
        return None
    loads = [json.loads(line)["load1"] for line in path.read_text().splitlines() if line]
    return {"samples": len(loads), "min": min(loads), "median": float(np.median(loads)), "max": max(loads)}


def format_report(report: dict) -> str:
    rounds, unit = report["rounds"], report["unit"]
    lines = [f"capacity under SLO {report['slo']['name']} ({report['slo']['spec']}), {unit}; {rounds} rounds, "
             f"runs: A {rounds}, A2 {rounds} (identical), B {rounds} (planted delay)"]
    if report["pilot"]:
        lines.append(f"pilot: capacities {report['pilot']['capacity']}; change against A, %: "
                     f"{report['pilot']['change_pct']}; planted {report['pilot']['delay_ms']:g} ms per step")
    lines.append(f"   {'round':<7}" + "".join(f"{v:>8}" for v in VARIANTS))
    for k in range(rounds):
        lines.append(f"   {k + 1:<7}" + "".join(f"{_cell(report['capacity'][v][k]):>8}" for v in VARIANTS))
    spread, planted = report["spread"], report["planted_change_pct"]
    lines.append(f"A/A spread: SD of log capacity {spread['aa_runs_sd_log_pct']} % over the {2 * rounds} A and A2 "
                 f"runs, {spread['within_round_sd_log_pct']} % per run within a round; A = A2 in "
                 f"{spread['rounds_a_equals_a2']} of {spread['rounds_compared']} rounds")
    lines.append(f"B's change: {planted['B_vs_A_geometric']:+.1f} % against A, {planted['B_vs_A2_geometric']:+.1f} % "
                 f"against A2 (geometric means of per-round ratios), {planted['ratio_of_means']:+.1f} % ratio of means")
    for name, found in report["all_rounds"].items():
        ci = "" if found["ci_pct"] is None else f" [{found['ci_pct'][0]:+.1f}, {found['ci_pct'][1]:+.1f}]"
        change = "n/a" if found["delta_pct"] is None else f"{found['delta_pct']:+.1f} %"
        floor = "" if found["floor_pct"] is None else f", resolution alone +-{found['floor_pct']:.1f} %"
        lines.append(f"all {rounds} rounds, {name}: {change}{ci}, {found['verdict']}{floor}")
    lines.append("comparisons share runs: the distinct runs are the sample (A/A: the 2 x rounds identical runs; "
                 "blocks add the B runs)")
    lines.append(f"   {'rounds':<8}{'design':<8}{'A/A false':>22}{'n/a':>6}{f'A/A {-CHANGE_PCT:g} % worse':>24}"
                 f"{'B worse':>24}")
    sizes = [(str(n), by_design) for n, by_design in report["by_size"].items()] + [("all", report["pooled"])]
    for n, by_design in sizes:
        for design, c in by_design.items():
            lines.append(f"   {n:<8}{design:<8}{_share(c['aa_false'], c['aa']):>22}{c['aa_na']:>6}"
                         f"{_share(c['spike_worse'], c['aa']):>24}{_share(c['ab_worse'], c['ab']):>24}")
    if report["load"]:
        load = report["load"]
        lines.append(f"load average (1 min) during the runs: min {load['min']:.2f}, median {load['median']:.2f}, "
                     f"max {load['max']:.2f} ({load['samples']} samples)")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _share(hits: int, total: int) -> str:
    return f"{hits} / {total} = {100.0 * hits / total:.1f} %" if total else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/capcal", help="results folder (default /tmp/capcal)")
    p.add_argument("--analyze", metavar="DIR", help="only analyse the runs already in DIR")
    p.add_argument("--rounds", type=int, default=14, help="rounds of A, A2, B (default 14)")
    p.add_argument("--budget-s", type=float, default=math.inf,
                   help="start no round that would end later than this many seconds after the script's start")
    p.add_argument("--delay-ms", type=float, help="planted per-step delay (default: the pilot's choice)")
    p.add_argument("--pilot-delays", default="5,10,20", help="the pilot's candidate delays, ms (default 5,10,20)")
    p.add_argument("--pilot-rounds", type=int, default=1, help="the pilot's rounds (default 1)")
    p.add_argument("--slo", default="standard")
    p.add_argument("--duration", type=float, default=8.0, help="window per probe, s (default 8)")
    p.add_argument("--warmup", default="2req")
    p.add_argument("--seed", type=int, default=0)
    add_workload_flags(p)
    p.add_argument("--server-cpus", metavar="LIST", help="CPUs of every server's processes (recipe server.cpus)")
    p.add_argument("--client-cpus", metavar="LIST", help="CPUs of the load generator (recipe sweep.client_cpus)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    out = Path(args.analyze) if args.analyze else collect(args)
    report = analyze(out)
    print(format_report(report))
    print(f"wrote {out / 'capacity_calibration.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
