"""The capacity search against a fine sweep: does `loadgen capacity`'s interval hold the capacity
read off a sweep of every concurrency around it, and in what share of the sweep's wall time?

Runs `loadgen capacity` against a server, then `loadgen replay --conc A,A+1,...,B` over a range
that brackets the search's interval by `--span` agents on each side, with the same window,
warm-up, SLO and workload flags (everything after `--` goes to both). The sweep's capacity is read
with the search's own estimator (loadgen/capacity/search.py) over its levels: every concurrency is
a probe. Prints both answers, both wall times and their ratio, and one JSON line.

    server start --model v32 &
    python benchmarks/capacity_vs_sweep.py --url http://127.0.0.1:8000 --slo interactive \\
        --duration 20 --warmup 1req -- --token-scale 0.25 --think-time-scale 0.02 --think-time-cap 2

`--sweep-limit-s` stops the sweep (SIGINT: the levels measured so far are kept) when a device's
time is short; the JSON line then says how far it got.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadgen.capacity.config import DEFAULT_SLO
from loadgen.capacity.search import Probe, capacity_from_curve
from loadgen.defaults import DEFAULTS
from loadgen.results.attainment import Share
from loadgen.results.file import read_results
from loadgen.run.sweep import share_of

ROOT = Path(__file__).resolve().parents[1]


def loadgen(command: str, flags: list[str], limit_s: float | None = None) -> tuple[int, float]:
    """Run a loadgen command; (exit code, wall seconds). At `limit_s` it is interrupted (SIGINT) and
    keeps what it measured."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", command, *flags], cwd=ROOT)
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        code = proc.wait()
    return code, time.monotonic() - started


def sweep_capacity(result: Path, slo_name: str, target: float) -> dict:
    """The capacity read off a sweep: every level a probe of the search's estimator."""
    levels = read_results(result)["levels"]
    probes = []
    for level in levels:
        entry = next(e for e in level["slo"] if e["name"] == slo_name)
        share: Share = share_of(entry["requests"])
        probes.append(Probe(float(level["concurrency"]), share, level["label"], level["window_s"]))
    found = capacity_from_curve(probes, target, integer=True)
    found["levels"] = [(p.load, p.share.good, p.share.total) for p in probes]
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the server's base URL")
    p.add_argument("--slo", default=DEFAULT_SLO, help="the SLO searched (default %(default)s)")
    p.add_argument("--attainment", type=float, default=DEFAULTS.attainment,
                   help="target share of good requests (default %(default)s)")
    p.add_argument("--duration", type=float, default=20.0, help="window seconds, both runs (default %(default)s)")
    p.add_argument("--warmup", default="1req", help="warm-up, both runs (default %(default)s)")
    p.add_argument("--span", type=int, default=3, help="agents the sweep reaches beyond the interval (default %(default)s)")
    p.add_argument("--span-share", type=float, default=0.0,
                   help="... and this share of the interval's ends beyond them (default %(default)s)")
    p.add_argument("--sweep-limit-s", type=float, help="interrupt the sweep after this many seconds")
    p.add_argument("--search-limit-s", type=float, help="interrupt the search after this many seconds")
    p.add_argument("--low", help="the search's first probe (loadgen capacity --low)")
    p.add_argument("--out", type=Path, help="keep both runs' results here (default: a temporary folder)")
    p.add_argument("rest", nargs="*", help="after --: workload flags for both runs")
    args = p.parse_args()
    common = ["--url", args.url, "--slo", args.slo, "--attainment", str(args.attainment), "--duration",
              str(args.duration), "--warmup", args.warmup, "--quiet", *args.rest]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        first_probe = ["--low", args.low] if args.low else []
        code, search_s = loadgen("capacity", [*common, *first_probe, "--out", str(out / "capacity")],
                                 args.search_limit_s)
        if code not in (0, 1, 130):
            sys.exit(f"capacity_vs_sweep: loadgen capacity failed (exit {code})")
        found = read_results(out / "capacity" / "result.json")["capacity"]
        if found["capacity"] is None:
            sys.exit(f"capacity_vs_sweep: the search found no capacity to sweep around: {found}")
        low = found["low"] if found["low"] is not None else found["capacity"]
        high = found["high"] if found["high"] is not None else found["capacity"]
        first = max(1, int(low * (1 - args.span_share)) - args.span)
        last = int(high * (1 + args.span_share) + 0.999) + args.span
        conc = ",".join(str(c) for c in range(first, last + 1))
        print(f"capacity_vs_sweep: search {found['capacity']} [{found['low']}, {found['high']}] in {search_s:.0f} s; "
              f"sweeping --conc {conc}", file=sys.stderr, flush=True)
        code, sweep_s = loadgen("replay", [*common, "--conc", conc, "--out", str(out / "sweep")], args.sweep_limit_s)
        swept = sweep_capacity(out / "sweep" / "result.json", found["slo"]["name"], args.attainment)
    inside = (swept["capacity"] is not None and (found["low"] is None or found["low"] <= swept["capacity"])
              and (found["high"] is None or swept["capacity"] <= found["high"]))
    row = {"search": {key: found[key] for key in ("capacity", "low", "high")}, "search_s": round(search_s, 1),
           "probes": [(p["load"], p["good"], p["total"], p["stopped_early"] is not None) for p in found["probes"]],
           "sweep": {key: swept[key] for key in ("capacity", "low", "high")}, "sweep_s": round(sweep_s, 1),
           "sweep_levels": swept["levels"], "sweep_complete": len(swept["levels"]) == last - first + 1,
           "inside": inside, "time_ratio": round(search_s / sweep_s, 3)}
    print(f"search: {found['capacity']} agents [{found['low']}, {found['high']}], {len(found['probes'])} probes, "
          f"{search_s:.0f} s")
    print(f"sweep:  {swept['capacity']} agents over --conc {first}..{last} "
          f"({len(swept['levels'])} levels measured), {sweep_s:.0f} s")
    print(f"the sweep's capacity is {'inside' if inside else 'OUTSIDE'} the search's interval; the search took "
          f"{search_s / sweep_s:.2f} of the sweep's time")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
