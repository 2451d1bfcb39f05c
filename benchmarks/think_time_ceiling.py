"""The usage line's output rate with a zero-latency server: what the workload alone allows.

At the recorded think times (minutes) a lane of `loadgen replay --conc 16 --duration 60 --warmup
1req` spends almost all of the window thinking, so the window's output tok/s is set by which
requests the plan puts in the window, not by the server. This replays the bundled sessions at full
length (v32's context, 163,840 tokens) against benchmarks/fast_sse_server.py, which answers every
request at once, once per seed, and prints each window's requests and output tok/s per GPU: what
the plan yields when serving takes no time.
`--tree DIR` runs the loadgen of another checkout (e.g. `git archive REV | tar -x -C DIR`), whose
plan may differ. The seeds run side by side: each lane is idle but for its requests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from client_overhead import ROOT, FastServer

from loadgen.results.file import read_results
from server.config import model_preset

# what replay against our v32 server takes as the context cap (its max_model_len): requests beyond it drop
V32_CONTEXT = model_preset("v32").max_position


def replay(tree: Path, url: str, seed: int, args: argparse.Namespace, out: Path) -> subprocess.Popen:
    flags = ["--conc", str(args.conc), "--duration", str(args.duration), "--warmup", args.warmup,
             "--token-scale", "1", "--think-time-scale", str(args.think_time_scale),
             "--max-context", str(V32_CONTEXT), "--gpus", "1", "--seed", str(seed), "--quiet", "--out", str(out)]
    return subprocess.Popen([sys.executable, "-m", "loadgen.cli", "replay", "--url", url, *flags], cwd=tree,
                            env=dict(os.environ, PYTHONPATH=str(tree)))


def level_row(result: Path) -> dict:
    level = read_results(result)["levels"][0]  # validated: an older tree's file too, or an error naming it
    counts = level["counts"]
    return {"requests": counts["requests_ok"], "errors": counts["errors_total"],
            "output_tokens": counts["output_tokens"],
            "tok_s_gpu": level["throughput"]["output_tokens_per_s_per_gpu"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3", help="replay seeds, one run each (default %(default)s)")
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout whose loadgen runs (default: this one)")
    p.add_argument("--conc", type=int, default=16, help="lanes (default %(default)s, the usage line's)")
    p.add_argument("--duration", type=float, default=60.0, help="window seconds (default %(default)s)")
    p.add_argument("--warmup", default="1req", help="warm-up (default %(default)s)")
    p.add_argument("--think-time-scale", type=float, default=1.0, help="think-time scale (default %(default)s: as recorded)")
    args = p.parse_args()
    seeds = list(dict.fromkeys(int(s) for s in args.seeds.split(",")))
    print(f"think_time_ceiling: {len(seeds)} replays side by side, each a warm-up and a {args.duration:g} s window",
          file=sys.stderr, flush=True)
    server = FastServer()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = {seed: replay(args.tree.resolve(), server.url, seed, args, Path(tmp) / f"s{seed}")
                    for seed in seeds}
            codes = [proc.wait() for proc in runs.values()]  # all of them, before their folder goes
            if any(codes):
                sys.exit("think_time_ceiling: a replay failed (its error is above)")
            rows = {seed: level_row(Path(tmp) / f"s{seed}" / "result.json") for seed in seeds}
    finally:
        server.stop()
    print(f"loadgen of {args.tree}: conc {args.conc}, window {args.duration:g} s, warm-up {args.warmup}, "
          f"think-time scale {args.think_time_scale:g}, sessions at full length, zero-latency server")
    print(f"{'seed':>4} {'requests':>8} {'errors':>6} {'output tok':>10} {'tok/s/GPU':>9}")
    for seed, row in rows.items():
        print(f"{seed:>4} {row['requests']:>8} {row['errors']:>6} {row['output_tokens']:>10} {row['tok_s_gpu']:>9.1f}")
    print(json.dumps({"tree": str(args.tree), "rows": rows}))


if __name__ == "__main__":
    main()
