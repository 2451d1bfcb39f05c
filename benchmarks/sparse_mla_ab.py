"""A/B of the sparse MLA kernel against another revision's kernels/sparse_mla.py, in one process.

    git show 8cdd4fb:kernels/sparse_mla.py > kernels/_baseline_sparse_mla.py
    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/sparse_mla_ab.py --baseline kernels._baseline_sparse_mla

(the baseline file goes inside the package so its relative imports of kernels.* resolve; delete it
after). Each case draws inputs as benchmarks/kernels.py does (random slots over --kv-slots cache
rows, three input sets in rotation, L2 flushed by do_bench); both sides are first checked against
the torch reference with poisoned outputs (docs/sparse_mla.md bars) and run twice on the same
inputs, which must give bitwise the same output, then timed alternately
--repeats times in ABBA order, so drift of the machine hits both; each side launches with its own default tiles
and automatic split count unless --config / --splits set the candidate's. Several --config give several
candidates, timed in the same rotation; --aa times the baseline a second time, as its own side, for the
spread between two timings of one kernel.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import statistics
import sys
from pathlib import Path
from types import ModuleType

import torch
import triton

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
sys.path.append(str(_ROOT / "benchmarks"))  # after the root: `kernels` stays the package
from kernels_module import kernels_benchmark  # noqa: E402

bk = kernels_benchmark()

from kernels.quant import kv_row_bytes  # noqa: E402
from kernels.triton_utils import poisoned_outputs  # noqa: E402

candidate = importlib.import_module("kernels.sparse_mla")

# name: (tokens, heads, kv dtype[, K: default benchmarks/kernels.py's]): issue 12's decode shapes, the
# small model's batch-128 decode step (index_topk 512), v32's decode step and a prefill chunk
CASES = {
    "decode-b64-h128-bf16": (64, 128, "bf16"),
    "decode-b64-h16-bf16": (64, 16, "bf16"),
    "small-decode-b128-k512-h16-bf16": (128, 16, "bf16", 512),
    "v32-decode-b16-h128-bf16": (16, 128, "bf16"),
    "prefill-t2048-h128-bf16": (2048, 128, "bf16"),
    "decode-b64-h128-fp8": (64, 128, "fp8_ds_mla"),
    "decode-b64-h16-fp8": (64, 16, "fp8_ds_mla"),
}
SMOKE_CASES = {"decode-b2-h16-bf16": (2, 16, "bf16"), "decode-b2-h16-fp8": (2, 16, "fp8_ds_mla")}


def check(mod: ModuleType, q, cache, idx, kv_dtype, splits, cfg, ref, ref_lse) -> str:
    """'ok' or 'FAIL' with the errors, for one side's output against the reference."""
    with poisoned_outputs():
        out, lse = mod.sparse_mla_triton(q[..., :bk.D_C], q[..., bk.D_C:], cache, idx, bk.SCALE, kv_dtype, splits, cfg)
        again = mod.sparse_mla_triton(q[..., :bk.D_C], q[..., bk.D_C:], cache, idx, bk.SCALE, kv_dtype, splits, cfg)
    repeat = torch.equal(out, again[0]) and torch.equal(lse, again[1])  # bitwise, run to run
    o, r = out.float(), ref.float()
    bad = int((~((o - r).abs() <= torch.maximum(torch.full_like(r, 1e-3), r.abs() * (2 / 128)))).sum())
    finite = torch.isfinite(ref_lse)
    lse_err = float((lse[finite] - ref_lse[finite]).abs().max()) if finite.any() else 0.0
    diff = bk.calc_diff(o, r)
    ok = bad == 0 and diff < 5e-6 and torch.equal(torch.isinf(lse), ~finite) and repeat
    return (f"{'ok' if ok else 'FAIL'} (elem-fail {bad}, diff {diff:.1e}, lse err {lse_err:.1e}, "
            f"{'bitwise' if repeat else 'NOT bitwise'} repeat)")


def launch_label(mod: ModuleType, tokens: int, heads: int, kv_dtype: str, topk: int, cache, cfg, splits) -> str:
    """The tiles and split count a side launches with (its own automatic choice when not given)."""
    cfg = cfg or mod.default_config(heads, kv_dtype, torch.device(bk.DEV))
    if splits is None:
        ratio = heads * (bk.D_C + 1) * 4 / (topk * cache.shape[1] * cache.element_size())
        programs = tokens * triton.cdiv(heads, cfg.block_h)
        # revisions up to 8cdd4fb took block_n where later ones take the config
        per_config = "cfg" in inspect.signature(mod.auto_num_splits).parameters
        splits = mod.auto_num_splits(programs, topk, cfg if per_config else cfg.block_n, torch.device(bk.DEV),
                                     ratio)
    return f"{cfg}, {splits} split(s)"


def run_case(name: str, shape: tuple[int, int, str] | tuple[int, int, str, int], sides: list[tuple[str, ModuleType, object, int | None]],
             num_slots: int, repeats: int) -> None:
    tokens, heads, kv_dtype, topk = (*shape, bk.TOPK)[:4]
    cache = bk.make_kv_cache(num_slots, kv_dtype)
    sets = [(torch.randn(tokens, heads, bk.D_C + bk.D_R, device=bk.DEV).bfloat16(),
             torch.randint(0, num_slots, (tokens, topk), device=bk.DEV, dtype=torch.int32)) for _ in range(3)]
    q0, idx0 = sets[0][0], sets[0][1].clone()
    idx0[0] = -1  # a token with no valid entry and one with a short context
    idx0[1, topk // 3:] = -1
    ref, ref_lse = candidate.sparse_mla_torch(q0, cache, idx0, bk.SCALE, bk.D_C, kv_dtype)
    flops = 2.0 * tokens * heads * topk * (2 * bk.D_C + bk.D_R)
    nbytes = tokens * topk * (kv_row_bytes(bk.D_C, bk.D_R, kv_dtype) + 4) + tokens * heads * (
        2 * (bk.D_C + bk.D_R) + 2 * bk.D_C + 4)
    times: dict[str, list[float]] = {label: [] for label, *_ in sides}
    for label, mod, cfg, splits in sides:
        verdict = check(mod, q0, cache, idx0, kv_dtype, splits, cfg, ref, ref_lse)
        print(f"{name} {label}: {launch_label(mod, tokens, heads, kv_dtype, topk, cache, cfg, splits)}: check "
              f"{verdict}", flush=True)
    for r in range(repeats):  # ABBA...: a drift or an order effect falls on both sides
        for label, mod, cfg, splits in sides if r % 2 == 0 else sides[::-1]:
            ms = bk.bench([lambda q=q, i=i, mod=mod, cfg=cfg, splits=splits: mod.sparse_mla_triton(
                q[..., :bk.D_C], q[..., bk.D_C:], cache, i, bk.SCALE, kv_dtype, splits, cfg)
                for q, i in sets])
            times[label].append(ms)
            print(f"{name} {label}: {ms * 1e3:8.1f} us {flops / ms / 1e9:6.1f} TFLOP/s "
                  f"{100 * nbytes / ms / 1e9 / bk.COPY_TBPS:5.1f}% of copy", flush=True)
    # the fastest timing beside the median: a slow state of the machine can last a whole timing and
    # so take half of a few repeats, which the median alone would report as a change (--aa shows it)
    base, base_min = statistics.median(times["baseline"]), min(times["baseline"])
    for label, *_ in sides[1:]:
        other, other_min = statistics.median(times[label]), min(times[label])
        print(f"{name}: median baseline {base * 1e3:.1f} us, {label} {other * 1e3:.1f} us, "
              f"{label} / baseline {other / base:.3f}; fastest {base_min * 1e3:.1f} and {other_min * 1e3:.1f} us, "
              f"{other_min / base_min:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="module path of the baseline kernel file, e.g. "
                        "kernels._baseline_sparse_mla")
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="run only these cases (repeatable)")
    parser.add_argument("--config", action="append", help="candidate tiles as SparseMlaConfig fields, "
                        "comma-separated (block_h,block_n,num_warps,num_stages[,preload_tiles[,programs_per_sm]]); "
                        "repeatable: one candidate each")
    parser.add_argument("--aa", action="store_true", help="time the baseline twice, as two sides (A/A spread)")
    parser.add_argument("--splits", type=int, help="candidate split count (default: its automatic choice)")
    parser.add_argument("--repeats", type=int, default=2, help="timings per side, alternating")
    parser.add_argument("--kv-slots", type=int, default=1 << 20, help="KV cache rows the indices draw from")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (set TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    if args.smoke:
        bk.DEV, bk.SMOKE, bk.TOPK = "cpu", True, 64
    elif not torch.cuda.is_available():
        print("benchmarks/sparse_mla_ab.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    baseline = importlib.import_module(args.baseline)
    sides = [("baseline", baseline, None, None)] + [("baseline-again", baseline, None, None)] * args.aa
    configs = [candidate.SparseMlaConfig(*(int(x) for x in text.split(","))) for text in args.config or []] or [None]
    for n, cfg in enumerate(configs):
        sides.append(("candidate" if len(configs) == 1 else f"candidate{n + 1}", candidate, cfg, args.splits))
    cases = SMOKE_CASES if args.smoke else {name: CASES[name] for name in args.case or CASES}
    print(f"device: {'cpu (smoke)' if args.smoke else torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {triton.__version__}; % of copy at the issue's {bk.COPY_TBPS} TB/s", flush=True)
    torch.manual_seed(0)
    for name, shape in cases.items():
        run_case(name, shape, sides, 4096 if args.smoke else args.kv_slots, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
