"""Per-kernel device time of a decode step's CUDA graph (GPU, not run by CI).

Builds benchmarks/engine.py's decode setup (its flags: --model, --batches, --context, ...), runs
--warmup graph steps, times the step's graph replayed back to back, then replays it under
torch.profiler and prints the kernels grouped by name (us per replay, launches per replay, share
of the kernel time) and the first layer's kernels in launch order, so each projection's kernel
and time can be read off by position.

    PYTHONPATH=. python3 benchmarks/decode_profile.py --model small --batches 128 --context 4096
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.engine import decode_engine, parse_args, replay_seconds  # noqa: E402

REPLAYS = 10


def profile_batch(args: argparse.Namespace, batch: int) -> None:
    """Profile one decode batch size's graph (args: benchmarks/engine.py's flags)."""
    steps = args.warmup + 2
    engine = decode_engine(args, "triton", args.kv_dtypes.split(",")[0], batch, "graph", steps)
    for _ in range(steps):
        engine.step()
    seconds = min(replay_seconds(engine, reps=50) for _ in range(3))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay_seconds(engine, reps=REPLAYS - 1)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_replay = len(kernels) // REPLAYS
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.time_range.elapsed_us())
    total = sum(map(sum, by_name.values())) / REPLAYS
    print(f"{args.model} B={batch} context {args.context}: graph replay {seconds * 1e3:.3f} ms (best of 3 x 50); "
          f"{per_replay} kernels, kernel time {total:.1f} us per replay")
    print(f"  {'us/replay':>9} {'count':>5} {'share':>6}  kernel")
    for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(times) / REPLAYS:9.1f} {len(times) // REPLAYS:5d} {sum(times) / REPLAYS / total:6.1%}  {name}")
    layers = engine.config.model.num_layers
    print(f"  one replay's first {per_replay // layers} kernels in order (us):")
    for e in kernels[:per_replay // layers]:
        print(f"    {e.time_range.elapsed_us():7.1f}  {e.name[:100]}")
    print(f"  ... its last {per_replay // layers // 2} kernels:")
    for e in kernels[per_replay - per_replay // layers // 2:per_replay]:
        print(f"    {e.time_range.elapsed_us():7.1f}  {e.name[:100]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/decode_profile.py needs a CUDA GPU", file=sys.stderr)
        return 2
    for batch in (int(b) for b in args.batches.split(",") if b):
        profile_batch(args, batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
