"""Overhead of the in-process transport (`loadgen bench`) against HTTP (`server start` +
`loadgen replay --url`): the same engine flags, the same traces, levels, seed and window.

Each repeat runs both modes back to back (HTTP first, then in-process, alternating the order on
odd repeats), each in fresh processes: `server start` as a subprocess with the client
`loadgen replay` in another; `loadgen bench` alone in one. Per level and mode it reports the
medians over repeats of: TTFT p50/p90 (per-request cost: request hand-off + first step + first
token back), ITL p50 and TPOT p50 (per-token cost: one step's outputs reaching the client),
E2EL p50, output tokens/s and requests/s, and the client event loop's p99 lag; then the
in-process minus HTTP difference. Negative deltas mean in-process is faster.

    python benchmarks/inprocess_overhead.py                      # tiny on CPU, conc 1 and 4
    python benchmarks/inprocess_overhead.py --conc 1,8 --duration 30 --repeats 2 -- --model small
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
READY = re.compile(r"ready at (http://\S+) ")
# (label, how to read it from a level, unit scale): latencies are stored in microseconds.
ROWS = (
    ("TTFT p50 (ms)", lambda lv: lv["metrics"]["ttft"]["stats"]["p50"] / 1000),
    ("TTFT p90 (ms)", lambda lv: lv["metrics"]["ttft"]["stats"]["p90"] / 1000),
    ("ITL p50 (ms)", lambda lv: lv["metrics"]["itl"]["stats"]["p50"] / 1000),
    ("TPOT p50 (ms)", lambda lv: lv["metrics"]["tpot"]["stats"]["p50"] / 1000),
    ("E2EL p50 (ms)", lambda lv: lv["metrics"]["e2el"]["stats"]["p50"] / 1000),
    ("output tok/s", lambda lv: lv["throughput"]["output_tokens_per_s"]),
    ("requests/s", lambda lv: lv["throughput"]["requests_per_s"]),
    ("client loop lag p99 (ms)", lambda lv: lv["metrics"]["loop_lag"]["stats"]["p99"] / 1000),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conc", default="1,4", help="closed-loop levels (default 1,4)")
    parser.add_argument("--duration", type=float, default=20.0, help="window per level, seconds (default 20)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode (default 1)")
    parser.add_argument("--out", help="keep the results files here (default: a temporary folder)")
    parser.add_argument("engine", nargs="*", metavar="-- ENGINE FLAGS",
                        help="engine flags for both modes (default: --model tiny --device cpu)")
    args = parser.parse_args()
    engine = args.engine or ["--model", "tiny", "--device", "cpu"]
    load = ["--conc", args.conc, "--duration", str(args.duration), "--warmup", "2req", "--seed", "0",
            "--token-scale", "0.02", "--think-time-scale", "0.01", "--think-time-cap", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        runs: dict[str, list[dict]] = {"http": [], "inprocess": []}
        for repeat in range(args.repeats):
            order = ("http", "inprocess") if repeat % 2 == 0 else ("inprocess", "http")
            for mode in order:
                folder = out / f"{mode}{repeat}"
                runner = run_http if mode == "http" else run_inprocess
                started = time.monotonic()
                runner(folder, load, engine)
                print(f"{mode} run {repeat}: {time.monotonic() - started:.0f} s", file=sys.stderr)
                runs[mode].append(orjson.loads((folder / "result.json").read_bytes()))
        print_table(runs, engine, load)
    return 0


def run_http(folder: Path, load: list[str], engine: list[str]) -> None:
    log = tempfile.TemporaryFile()
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "start", "--port", "0", *engine],
                              cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = wait_ready(server, log)
        loadgen([*load, "--url", url], "replay", folder)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def run_inprocess(folder: Path, load: list[str], engine: list[str]) -> None:
    loadgen([*load, *engine, "--no-report"], "bench", folder)


def loadgen(flags: list[str], command: str, folder: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "loadgen.cli", command, *flags, "--out", str(folder), "--quiet"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"loadgen {command} failed ({done.returncode}):\n{done.stderr}")


def wait_ready(server: subprocess.Popen, log) -> str:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        log.seek(0)
        text = log.read().decode(errors="replace")
        match = READY.search(text)
        if match:
            return match.group(1)
        if server.poll() is not None:
            raise SystemExit(f"server start failed:\n{text}")
        time.sleep(0.1)
    raise SystemExit("server start: not ready after 300 s")


def print_table(runs: dict[str, list[dict]], engine: list[str], load: list[str]) -> None:
    first = runs["inprocess"][0]["config"]
    print(f"engine: {' '.join(engine)} | device {first['device']} | host {first['host']['cpu_count']} cores "
          f"({first['host'].get('cpu_model', '?')}) | load: {' '.join(load)} | repeats {len(runs['http'])}")
    labels = [level["label"] for level in runs["inprocess"][0]["levels"]]
    print("\n| level | metric | HTTP | in-process | in-process - HTTP | % |")
    print("|---|---|---|---|---|---|")
    for index, label in enumerate(labels):
        counts = {mode: statistics.median(r["levels"][index]["counts"]["requests_ok"] for r in runs[mode])
                  for mode in runs}
        print(f"| {label} | requests measured | {counts['http']:g} | {counts['inprocess']:g} | | |")
        for name, read in ROWS:
            http = statistics.median(read(r["levels"][index]) for r in runs["http"])
            inproc = statistics.median(read(r["levels"][index]) for r in runs["inprocess"])
            pct = f"{100 * (inproc - http) / http:+.1f}" if http else "-"
            print(f"| {label} | {name} | {http:.2f} | {inproc:.2f} | {inproc - http:+.2f} | {pct} |")


if __name__ == "__main__":
    sys.exit(main())
