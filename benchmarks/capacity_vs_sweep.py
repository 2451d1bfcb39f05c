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
time is short. A sweep too long for one sitting runs in parts on the same machine: `--only search`,
then `--only sweep --conc A..B` once per part (each into its own `--out`), then `--compare DIR...`
reads every part's levels and wall time (each part writes `timing.json` beside its results; a part
interrupted mid-level is charged up to the end of its last whole level).
"""

from __future__ import annotations

import argparse
import contextlib
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


def loadgen(command: str, flags: list[str], limit_s: float | None = None,
            results: Path | None = None) -> tuple[int, float, list[float]]:
    """Run a loadgen command; (exit code, wall seconds, seconds at which `results` had 1, 2, ... levels).
    At `limit_s` it is interrupted (SIGINT) and keeps what it measured."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", command, *flags], cwd=ROOT)
    level_times: list[float] = []
    stamp = None

    def look() -> None:
        nonlocal stamp
        if results is None or not results.exists() or (mtime := results.stat().st_mtime) == stamp:
            return
        with contextlib.suppress(ValueError, OSError):  # a write in progress: read it next time
            n = len(json.loads(results.read_bytes())["levels"])
            stamp = mtime
            level_times.extend([time.monotonic() - started] * (n - len(level_times)))

    while proc.poll() is None:
        if limit_s is not None and time.monotonic() - started > limit_s:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            break
        look()
        time.sleep(0.5)
    look()  # a level written after the last look
    return proc.returncode, time.monotonic() - started, level_times


def curve_capacity(results: list[Path], slo_name: str, target: float, whole_only: bool = True) -> dict:
    """The capacity read off runs' levels (a sweep's parts, or a search re-read) with this checkout's
    estimator: every level a probe. `whole_only` leaves out levels cut short (an interrupted sweep's)."""
    probes = []
    for result in results:
        doc = read_results(result)
        for level in whole_levels(doc) if whole_only else doc["levels"]:
            entry = next(e for e in level["slo"] if e["name"] == slo_name)
            share: Share = share_of(entry["requests"])
            probes.append(Probe(float(level["concurrency"]), share, level["label"], level["window_s"]))
    probes.sort(key=lambda p: p.load)
    found = capacity_from_curve(probes, target, integer=True)
    found["levels"] = [(p.load, p.share.good, p.share.total, p.share.verdict(target)) for p in probes]
    return found


def conc_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("..")
    return int(first), int(last or first)


def search(args: argparse.Namespace, common: list[str], out: Path) -> dict:
    first_probe = ["--low", args.low] if args.low else []
    code, search_s, _ = loadgen("capacity", [*common, *first_probe, "--out", str(out / "capacity")], args.search_limit_s)
    if code not in (0, 1, 130):
        sys.exit(f"capacity_vs_sweep: loadgen capacity failed (exit {code})")
    (out / "capacity" / "timing.json").write_text(json.dumps({"search_s": round(search_s, 1)}))
    found = read_results(out / "capacity" / "result.json")["capacity"]
    print(f"capacity_vs_sweep: search {found['capacity']} [{found['low']}, {found['high']}] in {search_s:.0f} s",
          file=sys.stderr, flush=True)
    return found


def sweep_range(args: argparse.Namespace, found: dict) -> tuple[int, int]:
    """The search's interval and `--span` agents (and `--span-share` of its ends) beyond it, or
    its capacity +- `--around`."""
    if found["capacity"] is None:
        sys.exit(f"capacity_vs_sweep: the search found no capacity to sweep around: {found}")
    if args.around is not None:
        return max(1, found["capacity"] - args.around), found["capacity"] + args.around
    low = found["low"] if found["low"] is not None else found["capacity"]
    high = found["high"] if found["high"] is not None else found["capacity"]
    return max(1, int(low * (1 - args.span_share)) - args.span), int(high * (1 + args.span_share) + 0.999) + args.span


def sweep(args: argparse.Namespace, common: list[str], out: Path, first: int, last: int) -> None:
    conc = ",".join(str(c) for c in range(first, last + 1))
    print(f"capacity_vs_sweep: sweeping --conc {first}..{last}", file=sys.stderr, flush=True)
    code, wall_s, level_times = loadgen("replay", [*common, "--conc", conc, "--out", str(out / "sweep")],
                                        args.sweep_limit_s, out / "sweep" / "result.json")
    if code not in (0, 1, 130):
        sys.exit(f"capacity_vs_sweep: loadgen replay failed (exit {code})")
    whole = len(whole_levels(read_results(out / "sweep" / "result.json")))
    # an interrupted part keeps the level it was cut in: it is not counted, nor is its time
    sweep_s = wall_s if code != 130 else (level_times[whole - 1] if whole else 0.0)
    (out / "sweep" / "timing.json").write_text(json.dumps({"sweep_s": round(sweep_s, 1), "wall_s": round(wall_s, 1),
                                                            "first": first, "last": last}))


def whole_levels(results: dict) -> list[dict]:
    """A sweep's levels that ran their whole window (an interrupted run keeps the level it was cut in)."""
    return [level for level in results["levels"] if level["window_s"] >= results["config"]["duration_s"] - 0.5]


def within(capacity: int | None, ends: dict) -> bool:
    """Whether `capacity` lies in the interval `ends` (an open end holds anything on its side)."""
    return capacity is not None and (ends["low"] is None or ends["low"] <= capacity) and (
        ends["high"] is None or capacity <= ends["high"])


def compare(folders: list[Path], target: float) -> None:
    """Print the search against the sweep from the folders of `--only` parts (or of one whole run)."""
    searches = [f / "capacity" for f in folders if (f / "capacity" / "result.json").exists()]
    parts = [f / "sweep" for f in folders if (f / "sweep" / "result.json").exists()]
    if len(searches) != 1 or not parts:
        sys.exit(f"capacity_vs_sweep: --compare needs one search and at least one sweep; got {len(searches)} "
                 f"searches and {len(parts)} sweeps in {', '.join(map(str, folders))}")
    found = read_results(searches[0] / "result.json")["capacity"]
    search_s = json.loads((searches[0] / "timing.json").read_text())["search_s"]
    timings = [json.loads((part / "timing.json").read_text()) for part in parts]
    sweep_s = sum(t["sweep_s"] for t in timings)
    swept = curve_capacity([part / "result.json" for part in parts], found["slo"]["name"], target)
    reread = curve_capacity([searches[0] / "result.json"], found["slo"]["name"], target, whole_only=False)
    planned = len(set().union(*(range(t["first"], t["last"] + 1) for t in timings)))
    inside, inside_reread = (within(swept["capacity"], ends) for ends in (found, reread))
    row = {"search": {key: found[key] for key in ("capacity", "low", "high")}, "search_s": search_s,
           "probes": [(p["load"], p["good"], p["total"], p["verdict"], p["stopped_early"] is not None)
                      for p in found["probes"]],
           "sweep": {key: swept[key] for key in ("capacity", "low", "high")}, "sweep_s": sweep_s,
           "sweep_parts": timings, "sweep_levels": swept["levels"], "sweep_complete": len(swept["levels"]) == planned,
           "inside": inside, "time_ratio": round(search_s / sweep_s, 3),
           "search_reread": {key: reread[key] for key in ("capacity", "low", "high", "design_effect", "dispersion")},
           "inside_reread": inside_reread}
    print(f"search: {_answer(found)}, {len(found['probes'])} probes, "
          f"{search_s:.0f} s")
    ranges = " + ".join(f"{t['first']}..{t['last']}" for t in timings)
    print(f"sweep:  {_answer(swept)} over {ranges} "
          f"({len(swept['levels'])} of {planned} levels "
          f"measured), {sweep_s:.0f} s")
    print(f"the sweep's capacity is {'inside' if inside else 'OUTSIDE'} the search's interval; the search took "
          f"{search_s / sweep_s:.2f} of the sweep's time")
    print(f"the search's probes re-read with this checkout's estimator: {_answer(reread)} "
          f"(sweep's capacity {'inside' if inside_reread else 'OUTSIDE'})")
    print(json.dumps(row))


def _answer(found: dict) -> str:
    """`56 agents [?, 56]`: an end no level decided is `?`, as `loadgen capacity` prints it."""
    low, high = ("?" if found[end] is None else found[end] for end in ("low", "high"))
    return f"{'?' if found['capacity'] is None else found['capacity']} agents [{low}, {high}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="the server's base URL (not with --compare)")
    p.add_argument("--slo", default=DEFAULT_SLO, help="the SLO searched (default %(default)s)")
    p.add_argument("--attainment", type=float, default=DEFAULTS.attainment,
                   help="target share of good requests (default %(default)s)")
    p.add_argument("--duration", type=float, default=20.0, help="window seconds, both runs (default %(default)s)")
    p.add_argument("--warmup", default="1req", help="warm-up, both runs (default %(default)s)")
    p.add_argument("--span", type=int, default=3, help="agents the sweep reaches beyond the interval (default %(default)s)")
    p.add_argument("--span-share", type=float, default=0.0,
                   help="... and this share of the interval's ends beyond them (default %(default)s)")
    p.add_argument("--around", type=int, metavar="N",
                   help="sweep the search's capacity +- N agents instead (a wide interval, little time)")
    p.add_argument("--sweep-limit-s", type=float, help="interrupt the sweep after this many seconds")
    p.add_argument("--search-limit-s", type=float, help="interrupt the search after this many seconds")
    p.add_argument("--low", help="the search's first probe (loadgen capacity --low)")
    p.add_argument("--only", choices=("search", "sweep"), help="run one phase (a sweep in parts: with --conc)")
    p.add_argument("--conc", type=conc_range, metavar="A..B", help="with --only sweep: the concurrencies swept")
    p.add_argument("--compare", type=Path, nargs="+", metavar="DIR",
                   help="no run: compare the search and the sweep parts kept in these --out folders")
    p.add_argument("--out", type=Path, help="keep the runs' results here (default: a temporary folder)")
    p.add_argument("rest", nargs="*", help="after --: workload flags for both runs")
    args = p.parse_args()
    if args.compare:
        compare(args.compare, args.attainment)
        return
    if not args.url:
        p.error("--url: required unless --compare")
    if args.only == "sweep" and not args.conc:
        p.error("--conc: required with --only sweep")
    common = ["--url", args.url, "--slo", args.slo, "--attainment", str(args.attainment), "--duration",
              str(args.duration), "--warmup", args.warmup, "--quiet", *args.rest]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        found = search(args, common, out) if args.only != "sweep" else None
        if args.only != "search":
            sweep(args, common, out, *(args.conc or sweep_range(args, found)))
        if args.only is None:
            compare([out], args.attainment)


if __name__ == "__main__":
    main()
