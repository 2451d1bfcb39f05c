"""Where identical runs' differences come from: placement, the server process, or the machine.

Three experiments on our server (default: the tiny engine on CPU), each a series of identical
`loadgen replay` runs (same seed, same plan) whose TPOT p50 is compared across runs:

  placement    fresh servers, runs alternating between "free" (every process may use every CPU)
               and "placed" (server on --server-cpus, load generator on --client-cpus)
  persistence  placed; runs alternating between one server kept up for the whole experiment and
               a fresh server per run: if a process's own luck (memory layout, hash seeds) made
               the noise, the persistent server's runs would agree with each other
  probe        placed, one persistent server; meanwhile a fixed pure-Python loop is timed every
               PROBE_PERIOD_S on each CPU named: if the machine's speed made the noise, TPOT p50
               follows the probe on a core the engine does not use

Prints each run and, per series, the SD of log TPOT p50 (in %) and the per-run SD between
neighbouring runs; `probe` also the correlation of each run's log TPOT p50 with the log of the
probe's mean over that run. Results: benchmarks/RESULTS.md.

  python benchmarks/noise_source.py placement --runs 5 --duration 20
  python benchmarks/noise_source.py persistence --runs 7 --duration 20
  python benchmarks/noise_source.py probe --runs 10 --duration 15 --probe-cpus 0,1
  python benchmarks/noise_source.py probe --model v32 --num-layers 4 --device cuda --token-scale 0.25 \
      --think-time-scale 0.02 --think-time-cap 2 --conc 8 --runs 8 --duration 15 \
      --server-cpus 0-7 --client-cpus 8-11 --probe-cpus 12,13     # a GPU host: does TPOT follow it?
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workload_flags import add_workload_flags

from loadgen.recipe.runner import load_command
from loadgen.recipe.schema import Recipe, ServerConfig, Sweep, Variant, Workload
from loadgen.recipe.server import RunningServer
from loadgen.run.affinity import parse_cpus, placed_on

PROBE_PERIOD_S = 2.0
PROBE = """
import sys, time
def work():
    total = 0
    for i in range(300_000):
        total += i * i % 7
    return total
while True:
    began = time.perf_counter()
    work()
    print(f"{time.time():.3f} {1000 * (time.perf_counter() - began):.3f}", flush=True)
    time.sleep(float(sys.argv[1]))
"""


def recipe(args: argparse.Namespace, placed: bool) -> Recipe:
    return Recipe(
        name="noise",
        server=ServerConfig(kind="ours", flags=(("model", args.model), ("device", args.device),
                                             *((("num_layers", args.num_layers),) if args.num_layers else ())),
                          cpus=args.server_cpus if placed else None),
        workload=Workload(token_scale=args.token_scale, think_time_scale=args.think_time_scale,
                          think_time_cap=args.think_time_cap),
        sweep=Sweep(conc=(args.conc,), duration_s=args.duration, warmup=args.warmup, repeats=1, seed=args.seed,
                    client_cpus=args.client_cpus if placed else None),
        variants=(Variant("A"),),
    )


def replay(r: Recipe, server: RunningServer, out: Path) -> tuple[float, float, float]:
    """(TPOT p50 in ms, start, end) of one run against a healthy server."""
    began = time.time()
    with placed_on(r.sweep.client_cpu_set()):
        subprocess.run(load_command(r, r.baseline, server.url, out, True), check=True)
    level = json.loads((out / "result.json").read_text())["levels"][0]
    return level["metrics"]["tpot"]["stats"]["p50"] / 1000.0, began, time.time()


def fresh_run(r: Recipe, out: Path) -> tuple[float, float, float]:
    out.mkdir(parents=True, exist_ok=True)
    server = RunningServer(r, r.baseline, out / "server.log")
    server.start()
    try:
        return replay(r, server, out)
    finally:
        server.stop()


def series_line(name: str, values: list[float]) -> str:
    logs = [math.log(v) for v in values]
    neighbours = math.sqrt(sum((b - a) ** 2 for a, b in zip(logs, logs[1:])) / (2 * (len(logs) - 1)))
    return (f"{name}: TPOT p50 mean {statistics.mean(values):.2f} ms, SD {100 * statistics.stdev(logs):.1f} %, "
            f"per-run SD between neighbours {100 * neighbours:.1f} % ({len(values)} runs)")


def placement(args: argparse.Namespace, out: Path) -> None:
    series: dict[str, list[float]] = {"free": [], "placed": []}
    for k in range(args.runs):
        for name in ("free", "placed") if k % 2 == 0 else ("placed", "free"):
            tpot, _, _ = fresh_run(recipe(args, name == "placed"), out / f"{name}-{k}")
            series[name].append(tpot)
            print(f"{name} {k}: TPOT p50 {tpot:.2f} ms", flush=True)
    for name, values in series.items():
        print(series_line(name, values))


def persistence(args: argparse.Namespace, out: Path) -> None:
    r = recipe(args, True)
    (out / "kept").mkdir(parents=True, exist_ok=True)
    kept = RunningServer(r, r.baseline, out / "kept" / "server.log")
    kept.start()
    series: dict[str, list[float]] = {"kept": [], "fresh": []}
    try:
        for k in range(args.runs):
            series["kept"].append(replay(r, kept, out / "kept" / str(k))[0])
            series["fresh"].append(fresh_run(r, out / f"fresh-{k}")[0])
            print(f"{k}: kept {series['kept'][-1]:.2f} ms, fresh {series['fresh'][-1]:.2f} ms", flush=True)
    finally:
        kept.stop()
    for name, values in series.items():
        print(series_line(name, values))


def probe(args: argparse.Namespace, out: Path) -> None:
    r = recipe(args, True)
    out.mkdir(parents=True, exist_ok=True)
    cpus = sorted(parse_cpus(args.probe_cpus, "--probe-cpus"))
    probes = []
    for cpu in cpus:
        with placed_on(frozenset({cpu})), open(out / f"probe-{cpu}.txt", "w") as sink:
            probes.append(subprocess.Popen([sys.executable, "-c", PROBE, str(PROBE_PERIOD_S)], stdout=sink))
    server = RunningServer(r, r.baseline, out / "server.log")
    runs = []
    try:
        server.start()
        for k in range(args.runs):
            runs.append(replay(r, server, out / str(k)))
            print(f"{k}: TPOT p50 {runs[-1][0]:.2f} ms", flush=True)
    finally:
        server.stop()
        for process in probes:
            process.kill()
            process.wait()
    print(series_line("persistent server", [tpot for tpot, _, _ in runs]))
    tpot_logs = np.log([tpot for tpot, _, _ in runs])
    for cpu in cpus:
        samples = [tuple(map(float, line.split())) for line in (out / f"probe-{cpu}.txt").read_text().splitlines()]
        # the first seconds of a run are its warm-up
        means = [statistics.mean([ms for t, ms in samples if began + args.probe_skip_s <= t <= end] or [math.nan])
                 for _, began, end in runs]
        probe_logs = np.log(means)
        print(f"probe on CPU {cpu}: mean {np.nanmean(means):.1f} ms, SD {100 * np.nanstd(probe_logs, ddof=1):.1f} %, "
              f"correlation with TPOT p50 (logs) {np.corrcoef(tpot_logs, probe_logs)[0, 1]:.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", choices=("placement", "persistence", "probe"))
    p.add_argument("--runs", type=int, default=6, help="runs per series (default 6)")
    p.add_argument("--duration", type=float, default=20.0, help="window per run, s (default 20)")
    p.add_argument("--server-cpus", default="1", help="placed: the server's CPUs (default 1)")
    p.add_argument("--client-cpus", default="0", help="placed: the load generator's CPUs (default 0)")
    p.add_argument("--probe-cpus", default="0,1", help="probe: CPUs timed (default 0,1)")
    p.add_argument("--probe-skip-s", type=float, default=3.0, help="probe: seconds of each run left out (warm-up)")
    p.add_argument("--num-layers", type=int, help="the model's layers (default: the preset's)")
    p.add_argument("--conc", type=int, default=2)
    p.add_argument("--warmup", default="1req")
    p.add_argument("--seed", type=int, default=3)
    add_workload_flags(p)
    p.add_argument("--out", default="/tmp/noise_source", help="results folder (default /tmp/noise_source)")
    args = p.parse_args()
    out = Path(args.out) / args.experiment
    {"placement": placement, "persistence": persistence, "probe": probe}[args.experiment](args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
