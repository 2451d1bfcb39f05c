"""Host-side cost of one engine decode step, counted on CPU: torch ops, Triton launches, host syncs.

The eager decode step of the engine is host-bound on a GPU (benchmarks/engine.py --modes eager), so what
matters is how much the host does per step, which does not need a GPU to count:
- torch ops: every aten op dispatched (a TorchDispatchMode sees each one);
- Triton launches: calls of the kernels' launchers (patched to count; run by the interpreter);
- host syncs: the aten ops that on a CUDA tensor make the host wait for the device: reading a
  value (`.item()`, `int(t)`, `bool(t)` -> item / is_nonzero / _local_scalar_dense; `.tolist()`
  is not dispatched, so the sampled tokens' one copy per step is not counted), data-dependent
  output shapes (nonzero, masked_select, unique, repeat_interleave without output_size), and
  copies to the host (not countable on CPU). Counted per decode step after warm-up. The kernels'
  range checks that run on CPU tensors only (kernels.backend.values_checkable) are switched off
  here, so the counts are those of the CUDA code path.
- step ms: wall time of `Engine.step()` on CPU with the torch backend (its reference kernels
  included); with a tiny model compute is small next to the host work, so it roughly tracks the
  host path. Not given for Triton: the interpreter's cost would swamp it.

    PYTHONPATH=. python benchmarks/engine_host_profile.py                    # small shapes, 2 layers
    PYTHONPATH=. python benchmarks/engine_host_profile.py --model tiny --num-layers 8
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.engine import make_engine, place_prefilled  # noqa: E402

# aten ops that wait for the device when their input is a CUDA tensor
SYNC_OPS = ("_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "unique", "_unique2", "repeat_interleave")


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = False  # inside a Triton launch: the interpreter's own tensor ops are not the engine's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.paused:
            return func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name == "repeat_interleave" and (kwargs or {}).get("output_size") is not None:
            name = "repeat_interleave_sized"  # no sync: the output size is given
        self.ops[name] += 1
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    """Counts Triton kernel launches by wrapping each kernel's `run` (a context manager; the
    kernels get their own `run` back on exit)."""

    # by module path: the kernels package re-exports functions under the modules' names
    KERNELS = (("kernels.indexer", "_indexer_logits_kernel"), ("kernels.indexer_tiled", "_indexer_tiled_kernel"),
               ("kernels.topk.in_registers", "_topk_in_registers_kernel"),
               ("kernels.topk.compacting", "_histogram_pass_kernel"), ("kernels.topk.compacting", "_split_kernel"),
               ("kernels.topk.compacting", "_finish_kernel"), ("kernels.topk.sampled", "_sample_kernel"),
               ("kernels.topk.sampled", "_mark_kernel"), ("kernels.topk.sampled", "_sampled_finish_kernel"),
               ("kernels.topk.slots", "_positions_to_slots_kernel"), ("kernels.sparse_mla", "_sparse_mla_kernel"),
               ("kernels.sparse_mla", "_combine_kernel"), ("kernels.fused", "_add_rms_norm_kernel"),
               ("kernels.fused", "_silu_mul_kernel"), ("kernels.attention_prep", "_mla_prepare_kernel"),
               ("kernels.attention_prep", "_indexer_prepare_kernel"), ("kernels.gemv", "_gemv_fma_kernel"),
               ("kernels.gemv", "_gemv_dot_kernel"), ("kernels.gemv_fused", "_gemv_prologue_kernel"),
               ("kernels.argmax", "_argmax_kernel"))

    def __init__(self) -> None:
        self.count = 0
        self.ops: OpCounter | None = None
        self._saved: list[tuple[object, object]] = []

    def __enter__(self) -> LaunchCounter:
        for module, name in self.KERNELS:
            kernel = getattr(importlib.import_module(module), name)
            run = kernel.run
            self._saved.append((kernel, run))

            def counted(*args, _run=run, **kw):
                self.count += 1
                if self.ops is not None:
                    self.ops.paused = True
                try:
                    return _run(*args, **kw)
                finally:
                    if self.ops is not None:
                        self.ops.paused = False

            kernel.run = counted
        return self

    def __exit__(self, *exc: object) -> None:
        for kernel, run in self._saved:
            kernel.run = run
        self._saved.clear()


@contextlib.contextmanager
def gpu_code_path() -> Iterator[None]:
    """Skip the value checks that the kernels run on CPU tensors only, as they do on a GPU."""
    modules = [importlib.import_module(m)
               for m in ("kernels.quant", "kernels.indexer", "kernels.topk.dispatch", "kernels.topk.slots")]
    saved = [m.values_checkable for m in modules]
    for m in modules:
        m.values_checkable = lambda t: False
    try:
        yield
    finally:
        for m, check in zip(modules, saved):
            m.values_checkable = check


def profile(args: argparse.Namespace, backend: str, launches: LaunchCounter) -> dict[str, float]:
    args.block_size, args.indexer_key_dtype, args.device = None, "fp8", "cpu"
    steps = args.warmup + args.steps
    max_len = args.context + steps + args.steps + 1
    bs = 16 if args.model == "tiny" else 64
    num_blocks = args.batch * -(-max_len // bs) + 1
    engine = make_engine(args, backend, args.kv, num_blocks, max_len, args.batch, max(args.batch, 64))
    place_prefilled(engine, args.batch, args.context, steps + args.steps)
    for _ in range(args.warmup):
        engine.step()
    counter, before = OpCounter(), launches.count
    launches.ops = counter
    with counter:
        for _ in range(args.steps):
            engine.step()
    ops = {k: v / args.steps for k, v in counter.ops.items()}
    per_step_launches = (launches.count - before) / args.steps
    launches.ops = None
    times = []
    for _ in range(args.steps if backend == "torch" else 0):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    syncs = sum(v for k, v in ops.items() if k in SYNC_OPS)
    return {"ops": sum(ops.values()), "launches": per_step_launches, "syncs": syncs,
            "python_ms": statistics.median(times) * 1e3 if times else float("nan"), "top": counter.ops.most_common(args.top),
            "sync_detail": {k: v for k, v in ops.items() if k in SYNC_OPS}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small", choices=("tiny", "small"))
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=600, help="tokens per request (above top-k on small)")
    p.add_argument("--kv", default="bf16", choices=("bf16", "fp8"))
    p.add_argument("--backends", default="torch,triton")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--top", type=int, default=0, help="also list the N most frequent ops per step")
    args = p.parse_args(argv)
    print(f"# host cost per decode step: {args.model} ({args.num_layers} layers), B={args.batch}, "
          f"context {args.context}, kv {args.kv}, CPU, torch {torch.__version__}")
    print(f"{'backend':8} {'torch ops':>10} {'per layer':>10} {'launches':>9} {'syncs':>6} {'per layer':>10} {'step ms':>8}  sync ops")
    for backend in args.backends.split(","):
        with LaunchCounter() as launches, gpu_code_path():
            r = profile(args, backend, launches)
        n = args.num_layers
        print(f"{backend:8} {r['ops']:10.0f} {r['ops'] / n:10.1f} {r['launches']:9.0f} {r['syncs']:6.0f} "
              f"{r['syncs'] / n:10.1f} {r['python_ms']:8.2f}  {r['sync_detail']}")
        if r["top"]:
            print("  " + ", ".join(f"{k} {v / args.steps:.0f}" for k, v in r["top"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
