"""Top-k slots run to run (GPU, not run by CI): repeated calls on the same rows, and their time.

For rows past the one-launch width (kernels/topk.py, SINGLE_PASS_MAX_COLS: the compacting path,
whose split places columns through atomic counters) and one row set inside it, each case calls
`topk_triton(..., slots=...)` (what the engine's topk_slots runs) `--calls` times on the same
inputs and counts results that differ from the first bit for bit (order included: the sparse
attention sums its rows in the order given), checks that every result selects the same set as
the torch reference, and times one call replayed in a CUDA graph. With `--baseline PATH` another
tree's kernels/topk.py is loaded beside this one (its imports resolve to this tree's helpers)
and measured in the same process, in alternating order, twice each.

    PYTHONPATH=. python benchmarks/topk_determinism.py --baseline ../s1/kernels/topk.py
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402

from kernels import topk as this_topk  # noqa: E402

# (rows, columns, row length, k): the small model's check at a context past 8,192 (8 requests),
# long-context decode of the small model (k 512) and v32's (k 2,048), and the small model's 4k
# decode rows (the one-launch kernel, for comparison)
CASES = ((8, 8320, 8300, 512), (1, 16384, 16384, 512), (128, 16384, 16384, 512), (16, 65536, 65536, 2048),
         (64, 65536, 65536, 2048), (32, 4150, 4096, 512))
BLOCK_SIZE = 64


def load_baseline(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_topk", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def case_inputs(rows: int, cols: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indexer-like logits (continuous, non-negative), lengths, a shuffled block table, seq ids."""
    gen = torch.Generator(device="cuda").manual_seed(rows * cols)
    logits = torch.randn(rows, cols, device="cuda", generator=gen).abs()
    lengths = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    blocks = -(-cols // BLOCK_SIZE)
    table = torch.randperm(rows * blocks, device="cuda", generator=gen).int().reshape(rows, blocks)
    return logits, lengths, table, torch.arange(rows, dtype=torch.int32, device="cuda")


def measure(module: ModuleType, inputs: tuple, k: int, calls: int) -> tuple[int, torch.Tensor, float]:
    """(results that differ from the first, the first result, ms per call in a CUDA graph)."""
    logits, lengths, table, seq_ids = inputs
    slots = module.SlotMap(table, seq_ids, BLOCK_SIZE)

    def call() -> torch.Tensor:
        return module.topk_triton(logits, lengths, k, slots=slots)

    results = [call() for _ in range(calls)]
    changed = sum(not torch.equal(r, results[0]) for r in results[1:])
    ms = triton.testing.do_bench_cudagraph(call, rep=100)
    return changed, results[0], ms


def same_set(got: torch.Tensor, inputs: tuple, k: int) -> bool:
    """Whether each row's slots are those of the torch reference's columns (as sets)."""
    logits, lengths, table, seq_ids = inputs
    ref = this_topk.positions_to_slots_reference(this_topk.topk_indices_torch(logits, lengths, k), table,
                                                 seq_ids.long(), BLOCK_SIZE)
    return torch.equal(got.sort(dim=1).values, ref.sort(dim=1).values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", help="another tree's kernels/topk.py, measured beside this one")
    p.add_argument("--calls", type=int, default=20, help="calls per case whose results are compared")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("topk_determinism: needs a CUDA GPU")
    impls = {"this": this_topk}
    if args.baseline:
        impls = {"baseline": load_baseline(args.baseline), **impls}
    print(f"# top-k slots run to run on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; {args.calls} calls per case")
    print(f"{'rows x cols (len), k':28} {'tree':9} {'differ':>7} {'set ok':>6} {'ms, two runs':>16}")
    for rows, cols, length, k in CASES:
        inputs = case_inputs(rows, cols, length)
        times: dict[str, list[float]] = {name: [] for name in impls}
        report: dict[str, tuple[int, bool]] = {}
        for _ in range(2):  # alternating order: baseline, this, baseline, this
            for name, module in impls.items():
                changed, first, ms = measure(module, inputs, k, args.calls)
                times[name].append(ms)
                previous = report.get(name, (0, True))
                report[name] = (previous[0] + changed, previous[1] and same_set(first, inputs, k))
        for name in impls:
            changed, ok = report[name]
            print(f"{f'{rows} x {cols} ({length}), {k}':28} {name:9} {f'{changed}/{2 * (args.calls - 1)}':>7} "
                  f"{'yes' if ok else 'NO':>6} {times[name][0]:7.4f} {times[name][1]:7.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
