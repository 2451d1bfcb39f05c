"""Top-k run to run and against another tree (GPU, not run by CI): repeated calls on the same rows,
checks against the torch reference, and their time beside torch.topk.

For rows past the one-launch width (kernels/topk/config.py, SINGLE_PASS_MAX_COLS) and one row set
inside it, each case calls `topk_triton(..., slots=...)` (what the engine's topk_slots runs)
`--calls` times on the same inputs and counts results that differ from the first bit for bit
(order included: the sparse attention sums its rows in the order given), checks that every result
selects the same set as the torch reference, and times one call replayed in a CUDA graph, as
slots and as positions (`topk_triton` alone), beside torch.topk over the same rows (eager and
replayed). With `--baseline PATH` another tree's kernels/topk/ package (or kernels/topk.py, from
before the package) is loaded beside this one (its imports of the rest of kernels resolve to this
tree's helpers) and measured in the same process, in alternating order, twice each; rows past 32k
columns also time this tree's VARIANTS. Before any timing, `--check`
compares every tree's positions with the reference on harder rows (ragged lengths, values crowded
together, rows of one value, ReLU ties) and requires this tree's rows in ascending column order.
`--profile` prints each kernel's device time per call (torch.profiler) at the wide cases.

    PYTHONPATH=. python benchmarks/topk_determinism.py --baseline ../s1/kernels/topk --check --profile
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402

from kernels import topk as this_topk  # noqa: E402
from kernels.triton_utils import poisoned_outputs  # noqa: E402

# (rows, columns, row length, k, ReLU'd logits): the small model's check at a context past 8,192
# (8 requests), long-context decode of the small model (k 512) and v32's (k 2,048), rows of 32k
# columns at 4k context, and the small model's 4k decode rows (the one-launch kernel, for comparison)
CASES = ((8, 8320, 8300, 512, False), (1, 16384, 16384, 512, False), (128, 16384, 16384, 512, False),
         (1, 32768, 4096, 512, False), (128, 32768, 4096, 512, False), (16, 65536, 65536, 2048, False),
         (64, 65536, 65536, 2048, False), (64, 65536, 65536, 2048, True), (32, 4150, 4096, 512, False))
BLOCK_SIZE = 64
WIDE = 32768  # rows past this many columns also time VARIANTS and are profiled
_GPU = torch.device("cuda")
_SAMPLED = this_topk.default_config(_GPU, WIDE + 1, 64)
# this tree's other configs for the wide rows: the sampled path's grids and sample sizes, and the
# compacting path at its former defaults (2,048-column histogram steps; per-hit atomics from 64 rows)
VARIANTS = {
    "sampled chunk 1024": replace(_SAMPLED, chunk=1024),
    "sampled, sample 4096, list 8192": replace(_SAMPLED, sample=4096, candidates=8192),
    "compacting (former default)": this_topk.TopkConfig(2048, 1024, 4, 8, hist_block=2048),
}


def load_baseline(path: str) -> ModuleType:
    """Another tree's top-k: its kernels/topk/ package, or a single kernels/topk.py."""
    if Path(path).is_dir():
        return load_baseline_package(Path(path))
    spec = importlib.util.spec_from_file_location("baseline_topk", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_baseline_package(where: Path) -> ModuleType:
    """Another tree's kernels/topk/ package, imported as kernels.topk while this tree's modules of
    that name are set aside (its modules import each other by those names), then set aside in turn:
    both stay loaded, each module reaching its own tree's through the functions' globals."""
    ours = {name: sys.modules.pop(name) for name in topk_module_names()}
    spec = importlib.util.spec_from_file_location("kernels.topk", where / "__init__.py",
                                                  submodule_search_locations=[str(where)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {where}: not a package")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels.topk"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for name in topk_module_names():
            del sys.modules[name]
        sys.modules.update(ours)
    return module


def topk_module_names() -> list[str]:
    return [name for name in sys.modules if name == "kernels.topk" or name.startswith("kernels.topk.")]


def case_inputs(rows: int, cols: int, length: int, relu: bool) -> tuple[torch.Tensor, ...]:
    """Indexer-like logits (continuous, non-negative; or ReLU'd, half of them 0), lengths, a
    shuffled block table, seq ids."""
    gen = torch.Generator(device="cuda").manual_seed(rows * cols)
    logits = torch.randn(rows, cols, device="cuda", generator=gen)
    logits = logits.clamp_min(0) if relu else logits.abs()
    lengths = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    blocks = -(-cols // BLOCK_SIZE)
    table = torch.randperm(rows * blocks, device="cuda", generator=gen).int().reshape(rows, blocks)
    return logits, lengths, table, torch.arange(rows, dtype=torch.int32, device="cuda")


def graph_ms(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def measure(module: ModuleType, cfg, inputs: tuple, k: int, calls: int) -> tuple[int, torch.Tensor, float, float]:
    """(results that differ from the first, the first result, ms per call in a CUDA graph as
    slots, and as positions)."""
    logits, lengths, table, seq_ids = inputs
    slots = module.SlotMap(table, seq_ids, BLOCK_SIZE)

    def call() -> torch.Tensor:
        return module.topk_triton(logits, lengths, k, cfg, slots=slots)

    results = [call() for _ in range(calls)]
    changed = sum(not torch.equal(r, results[0]) for r in results[1:])
    return changed, results[0], graph_ms(call), graph_ms(lambda: module.topk_triton(logits, lengths, k, cfg))


def same_set(got: torch.Tensor, inputs: tuple, k: int) -> bool:
    """Whether each row's slots are those of the torch reference's columns (as sets)."""
    logits, lengths, table, seq_ids = inputs
    ref = this_topk.positions_to_slots_reference(this_topk.topk_indices_torch(logits, lengths, k), table,
                                                 seq_ids.long(), BLOCK_SIZE)
    return torch.equal(got.sort(dim=1).values, ref.sort(dim=1).values)


def check_rows(module: ModuleType, cfg, x: torch.Tensor, lengths: torch.Tensor, k: int, ordered: bool) -> bool:
    """Selected values equal the reference's per row, -1 padding as the reference's, indices inside
    the length, no index twice; with `ordered` each row's columns ascending."""
    with poisoned_outputs():
        got = module.topk_triton(x, lengths, k, cfg)
    ref = this_topk.topk_indices_torch(x, lengths, k)
    gv = torch.where(got >= 0, torch.gather(x, 1, got.long().clamp(min=0)), -1.0).sort(dim=1).values
    rv = torch.where(ref >= 0, torch.gather(x, 1, ref.long().clamp(min=0)), -1.0).sort(dim=1).values
    ok = torch.equal(gv, rv) and torch.equal(got < 0, ref < 0) and bool((got < lengths[:, None]).all())
    # the -1 padding as distinct columns past the row, ascending
    distinct = torch.where(got >= 0, got, x.shape[1] + torch.arange(k, device=x.device))
    ok = ok and bool((distinct.sort(dim=1).values.diff(dim=1) != 0).all())
    return ok and (not ordered or bool((distinct.diff(dim=1) > 0).all()))


def check(impls: dict, rows: int, cols: int, k: int) -> None:
    """Each tree's default (and this tree's variants past WIDE) on harder rows than the timed ones."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(rows, cols, device="cuda", generator=gen)
    ragged = torch.randint(0, cols + 1, (rows,), device="cuda", dtype=torch.int32, generator=gen)
    ragged[:4] = torch.tensor([0, k - 1, k, k + 1], device="cuda")
    full = torch.full((rows,), cols, device="cuda", dtype=torch.int32)
    kinds = {"ragged": (x.abs(), ragged), "relu": (x.clamp_min(0), full),
             "crowded 1+1e-4 N(0,1)": (1 + 1e-4 * x, full), "one value": (torch.ones_like(x), full),
             "1+1e-6 N(0,1) (few keys)": (1 + 1e-6 * x, full)}
    for name, (module, cfg) in impls.items():
        # this tree's multi-launch paths put each row in ascending order
        ordered = module is this_topk and cols > this_topk.SINGLE_PASS_MAX_COLS
        verdict = {kind: check_rows(module, cfg, xs, ls, k, ordered) for kind, (xs, ls) in kinds.items()}
        print(f"check {rows} x {cols}, k {k}, {name}: " + ", ".join(f"{kind} {'ok' if v else 'FAIL'}"
                                                                   for kind, v in verdict.items()), flush=True)


def profile(module: ModuleType, cfg, inputs: tuple, k: int, calls: int = 20) -> str:
    """Device time per call of each kernel of one positions call (torch.profiler, eager)."""
    logits, lengths = inputs[:2]
    module.topk_triton(logits, lengths, k, cfg)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            module.topk_triton(logits, lengths, k, cfg)
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        us = getattr(evt, "device_time_total", 0.0) or getattr(evt, "cuda_time_total", 0.0)
        if us:
            per_kernel[evt.key] += us / calls
    total = sum(per_kernel.values())
    return f"{total:.1f} us: " + ", ".join(f"{name} {us:.1f}" for name, us in
                                            sorted(per_kernel.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", help="another tree's kernels/topk/ (or kernels/topk.py), measured beside this one")
    p.add_argument("--calls", type=int, default=20, help="calls per case whose results are compared")
    p.add_argument("--check", action="store_true", help="check every tree on harder rows before timing")
    p.add_argument("--profile", action="store_true", help="print each kernel's time at the wide cases")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("topk_determinism: needs a CUDA GPU")
    impls = {"this": (this_topk, None)}
    if args.baseline:
        impls = {"baseline": (load_baseline(args.baseline), None), **impls}
    print(f"# top-k run to run on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; {args.calls} calls per case; us per call replayed in a CUDA graph")
    if args.check:
        wide = {**impls, **{name: (this_topk, cfg) for name, cfg in VARIANTS.items()}}
        check(wide, 64, 65536, 2048)
        check(impls, 8, 8320, 512)
    print(f"{'rows x cols (len), k':30} {'tree':32} {'differ':>7} {'set ok':>6} {'slots, two runs':>16} "
          f"{'positions, two runs':>20}")
    for rows, cols, length, k, relu in CASES:
        inputs = case_inputs(rows, cols, length, relu)
        logits = inputs[0]
        case = f"{rows} x {cols} ({length}), {k}{' relu' if relu else ''}"
        trees = {**impls, **({name: (this_topk, cfg) for name, cfg in VARIANTS.items()} if cols > WIDE else {})}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        report: dict[str, tuple[int, bool]] = {}
        for _ in range(2):  # alternating order: baseline, this, variants, baseline, this, variants
            for name, (module, cfg) in trees.items():
                changed, first, ms_slots, ms_positions = measure(module, cfg, inputs, k, args.calls)
                times[name].append((ms_slots, ms_positions))
                previous = report.get(name, (0, True))
                report[name] = (previous[0] + changed, previous[1] and same_set(first, inputs, k))
        for name in trees:
            changed, ok = report[name]
            (s1, p1), (s2, p2) = times[name]
            print(f"{case:30} {name:32} {f'{changed}/{2 * (args.calls - 1)}':>7} {'yes' if ok else 'NO':>6} "
                  f"{s1 * 1e3:7.1f} {s2 * 1e3:7.1f}  {p1 * 1e3:9.1f} {p2 * 1e3:9.1f}", flush=True)
        visible = logits[:, :length]
        eager = triton.testing.do_bench(lambda v=visible, k=k: torch.topk(v, k, dim=1), rep=100, return_mode="median")
        graphed = graph_ms(lambda v=visible, k=k: torch.topk(v, k, dim=1))
        print(f"{case:30} {'torch.topk eager / graph':32} {'':>7} {'':>6} {'':>16}  {eager * 1e3:9.1f} "
              f"{graphed * 1e3:9.1f}", flush=True)
        if args.profile and cols > WIDE:
            for name, (module, cfg) in impls.items():
                print(f"profile {case}, {name}: {profile(module, cfg, inputs, k)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
