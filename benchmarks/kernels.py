"""GPU benchmark of the kernels package at DeepSeek-V3.2 shapes (not run by CI).

First checks every Triton kernel against its torch reference on the GPU (fresh random inputs,
outputs poisoned, docs/sparse_mla.md bars), then times each one with triton.testing.do_bench (median
after warm-up; do_bench also flushes the L2 between runs, and inputs rotate among sets larger than
the 60 MB L2) and prints one table: time, TFLOP/s, GB/s, fractions of the measured ceilings and
the speed-up over torch eager (the package's torch references).

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/kernels.py 2>&1 | tee $OUT/kernels.txt
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

# This file is named like the package it measures: drop its own folder from the import path so
# `import kernels` finds the package at the repository root.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import kernels.argmax as argmax  # noqa: E402
import kernels.gemv as gemv  # noqa: E402
import kernels.gemv_fused as gemv_fused  # noqa: E402
from kernels.fused import add_rms_norm, silu_mul  # noqa: E402
from kernels.indexer import IndexerConfig, indexer_logits_paged_torch, indexer_logits_triton  # noqa: E402
from kernels.indexer_tiled import TiledConfig, indexer_logits_tiled  # noqa: E402
from kernels.quant import (  # noqa: E402
    fp8_e4m3_quantize,
    indexer_row_bytes,
    kv_row_bytes,
    kv_row_width,
    write_indexer_cache,
    write_kv_cache,
)
from kernels.sparse_mla import SparseMlaConfig, auto_num_splits, sparse_mla_torch, sparse_mla_triton  # noqa: E402
from kernels.topk import (  # noqa: E402
    SlotMap,
    TopkConfig,
    default_config,
    positions_to_slots,
    topk_indices_torch,
    topk_triton,
)
from kernels.topk.config import takes_register_launch  # noqa: E402
from kernels.topk.in_registers import REGISTER_ROW_MAX_COLS  # noqa: E402
from kernels.triton_utils import poisoned_outputs  # noqa: E402

COPY_TBPS = 4.04  # measured on this H200 (issue 4, 2026-11-29)
MATMUL_TFLOPS = 738.0
D_C, D_R, H_I, D_I, TOPK = 512, 64, 64, 128, 2048
SCALE = 192**-0.5
DEV = "cuda"
SMOKE = False  # --smoke: tiny shapes on CPU under TRITON_INTERPRET=1, to test this script itself


@dataclass(frozen=True)
class Row:
    case: str
    variant: str
    ms: float
    flops: float
    bytes: float
    eager_ms: float | None = None


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - cosine-style similarity used by FlashMLA / DeepGEMM tests."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denom) if denom > 0 else 0.0


def sweep_point(case: str, label: str, check, fns: list, timer=None) -> tuple[str, float] | None:
    """(check verdict, median ms by `timer`, default `bench`) of one swept config, or None when the
    compiler cannot fit it (reported, and the sweep goes on)."""
    try:
        verdict = check()
        ms = (timer or bench)(fns)
    except Exception as exc:
        print(f"{case} {label}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return None
    print(f"{case} {label}: check {verdict}, {ms * 1e3:.1f} us", flush=True)
    return verdict, ms


def bench(fns: list) -> float:
    """Median ms of calling the functions in rotation."""
    state = {"i": 0}
    if SMOKE:
        import time

        start = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - start) / len(fns) * 1e3

    def run() -> None:
        fns[state["i"] % len(fns)]()
        state["i"] += 1

    return triton.testing.do_bench(run, warmup=50, rep=300, return_mode="median")


def measure_ceilings() -> tuple[float, float]:
    src = torch.randn(1 << 12 if SMOKE else 1 << 29, device=DEV)  # 2 GiB
    dst = torch.empty_like(src)
    ms = bench([lambda: dst.copy_(src)])
    copy = 2 * src.numel() * 4 / ms / 1e9
    n = 64 if SMOKE else 8192
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    ms = bench([lambda: a @ b])
    del src, dst
    return copy, 2 * n**3 / ms / 1e9


# ---------------------------------------------------------------- sparse MLA


def make_kv_cache(num_slots: int, kv_dtype: str) -> torch.Tensor:
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    cache = torch.empty(num_slots, kv_row_width(D_C, D_R, kv_dtype), dtype=dtype, device=DEV)
    for lo in range(0, num_slots, 1 << 18):
        n = min(1 << 18, num_slots - lo)
        slots = torch.arange(lo, lo + n, device=DEV)
        write_kv_cache(cache, slots, torch.randn(n, D_C, device=DEV), torch.randn(n, D_R, device=DEV), kv_dtype)
    return cache


def check_sparse_mla(q, cache, idx, kv_dtype, num_splits, config) -> str:
    with poisoned_outputs():
        out, lse = sparse_mla_triton(q[..., :D_C], q[..., D_C:], cache, idx, SCALE, kv_dtype, num_splits, config)
    ref, ref_lse = sparse_mla_torch(q, cache, idx, SCALE, D_C, kv_dtype)
    if not SMOKE:
        torch.cuda.synchronize()
    o, r = out.float(), ref.float()
    bad = ~((o - r).abs() <= torch.maximum(torch.full_like(r, 1e-3), r.abs() * (2 / 128)))
    finite = torch.isfinite(ref_lse)
    lse_err = float((lse[finite] - ref_lse[finite]).abs().max()) if finite.any() else 0.0
    ok = not bad.any() and calc_diff(o, r) < 5e-6 and torch.equal(torch.isinf(lse), ~finite)
    # the lse bar (abs 1e-6) is reported apart: at |lse| ~ 8 it is about one fp32 ulp
    lse_note = "within 1e-6" if lse_err <= 1e-6 else "above the 1e-6 bar"
    return f"{'ok' if ok else 'FAIL'} (elem-fail {int(bad.sum())}, diff {calc_diff(o, r):.1e}, lse err {lse_err:.1e} {lse_note})"


def sparse_mla_work(tokens: int, heads: int, kv_dtype: str, topk: int | None = None) -> tuple[float, float]:
    """(FLOPs, bytes that must move) of sparse MLA over `topk` (default TOPK) rows per query token:
    the score (d_c + d_r) and output (d_c) products per row and head; each token's rows and indices
    read once, its queries read and outputs and lse written."""
    k = TOPK if topk is None else topk
    flops = 2.0 * tokens * heads * k * ((D_C + D_R) + D_C)
    nbytes = tokens * k * (kv_row_bytes(D_C, D_R, kv_dtype) + 4) + tokens * heads * (2 * (D_C + D_R) + 2 * D_C + 4)
    return flops, nbytes


def sparse_mla_cases(rows: list[Row], num_slots: int, batch: int, head_counts: tuple[int, ...] = (128, 16),
                     kv_dtypes: tuple[str, ...] = ("bf16", "fp8_ds_mla")) -> None:
    c = SparseMlaConfig
    sweep = {  # heads: (tile config, num_splits or None for the automatic choice)
        128: [(c(64, 64, 8, 2), None), (c(32, 64, 4, 2), None), (c(64, 64, 8, 1), None), (c(64, 32, 8, 2), None),
              (c(64, 64, 8, 3), None), (c(128, 32, 8, 2), None), (c(128, 32, 16, 2), None), (c(128, 64, 16, 2), None),
              (c(64, 32, 8, 3, 8), None)],
        16: [(c(16, 32, 4, 3, 8, 2), None), (c(16, 32, 4, 3, 8), 8), (c(16, 32, 4, 3), 4), (c(16, 32, 4, 2), None),
             (c(16, 64, 4, 2), 5), (c(16, 32, 4, 3), 8), (c(16, 32, 8, 4), 16), (c(16, 64, 4, 2), 8)],
    }
    for kv_dtype in kv_dtypes:
        cache = make_kv_cache(num_slots, kv_dtype)
        for heads, configs in ((h, sweep[h]) for h in head_counts):
            sets = [
                (torch.randn(batch, heads, D_C + D_R, device=DEV).bfloat16(),
                 torch.randint(0, num_slots, (batch, TOPK), device=DEV, dtype=torch.int32))
                for _ in range(3)
            ]
            case = f"sparse_mla {'prefill T' if batch > 256 else 'decode B'}{batch} H{heads} K{TOPK} {kv_dtype}"
            flops, nbytes = sparse_mla_work(batch, heads, kv_dtype)
            eager = bench([lambda q=q, i=i: sparse_mla_torch(q, cache, i, SCALE, D_C, kv_dtype) for q, i in sets])
            rows.append(Row(case, "torch eager", eager, flops, nbytes))
            # a fresh check set with some invalid entries (one token with none valid)
            q0, idx0 = sets[0][0], sets[0][1].clone()
            idx0[0] = -1
            idx0[1, TOPK // 3 :] = -1
            for cfg, forced in [(SparseMlaConfig(16, 16, 4, 1), None)] if SMOKE else configs:
                splits = forced or auto_num_splits(batch * triton.cdiv(heads, cfg.block_h), TOPK, cfg, q0.device)
                label = (f"triton h{cfg.block_h} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
                         f"{f' pre{cfg.preload_tiles}' if cfg.preload_tiles else ''} splits{splits}{'' if forced else '(auto)'}")
                point = sweep_point(
                    case, label, lambda cfg=cfg, splits=splits: check_sparse_mla(q0, cache, idx0, kv_dtype, splits, cfg),
                    [lambda qc=q[..., :D_C], qr=q[..., D_C:], i=i, cfg=cfg, splits=splits: sparse_mla_triton(
                        qc, qr, cache, i, SCALE, kv_dtype, splits, cfg) for q, i in sets])
                if point is not None:
                    rows.append(Row(case, f"{label} [{point[0].split()[0]}]", point[1], flops, nbytes, eager))
        del cache
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- indexer

# the per-token kernel's defaults (fp8 n64 w4 8/SM s1, MXFP4 n64 w4 8/SM) and the runners-up of earlier sweeps
INDEXER_SWEEP = (IndexerConfig(64, 4, 8), IndexerConfig(64, 4, 8, 1), IndexerConfig(64, 4, 16, 2), IndexerConfig(128, 8, 8, 2))


def make_indexer_cache(num_slots: int, key_dtype: str, block_size: int, wide_scales: bool = False) -> torch.Tensor:
    """An indexer key cache of random keys in every slot (num_slots a multiple of block_size; the
    cache's layout: kernels/quant.py), written a million keys at a time. With wide_scales every
    key's second 32-value group is 2^-20 of the others: MXFP4 group scales spread far past what one
    e4m3 operand per key holds (the group dots stay exact)."""
    cache = torch.empty(num_slots // block_size, block_size * indexer_row_bytes(D_I, key_dtype), dtype=torch.uint8,
                        device=DEV)
    for lo in range(0, num_slots, 1 << 20):
        n = min(1 << 20, num_slots - lo)
        keys = torch.randn(n, D_I, device=DEV)
        if wide_scales:
            keys[:, 32:64] *= 2.0**-20
        write_indexer_cache(cache, torch.arange(lo, lo + n, device=DEV), keys, key_dtype)
    return cache


def indexer_query(tokens: int, heads: int = H_I) -> tuple[torch.Tensor, torch.Tensor]:
    """Random fp8 queries and their head weights (with the quantisation scale folded in), as the model makes them."""
    q8, qs = fp8_e4m3_quantize(torch.randn(tokens, heads, D_I, device=DEV))
    return q8, (torch.randn(tokens, heads, device=DEV) * qs * (heads * D_I) ** -0.5).contiguous()


# The tiled kernel with one token per tile as a decode kernel: its fp8 dot takes the keys' bytes
# as they are, where the per-token kernel decodes every key element to fp16 first. The defaults
# (decode_tiled_config) and their runners-up of benchmarks/indexer_decode.py's sweep.
INDEXER_DECODE_TILED = {
    "fp8": (TiledConfig(1, 64, 4, 16, 1, prefetch=True), TiledConfig(1, 64, 4, 16, 1),
            TiledConfig(1, 128, 4, 8, 1, prefetch=True), TiledConfig(1, 128, 4, 8, 1)),
    "mxfp4": (TiledConfig(1, 64, 4, 3, 1, mx_scoring="group_dots", prefetch=True, one_wave=True),
              TiledConfig(1, 64, 4, 8, 1, mx_scoring="group_dots", prefetch=True),
              TiledConfig(1, 64, 4, 8, 1, mx_scoring="group_dots"),
              TiledConfig(1, 128, 4, 8)),
}


def logits_match(got: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float]:
    """(within the indexer's bar with the -inf mask exact and no NaN, the difference) of logits
    written into a poisoned output."""
    diff = calc_diff(got.nan_to_num(neginf=0), ref.nan_to_num(neginf=0))
    return diff < 5e-6 and torch.equal(torch.isinf(got), torch.isinf(ref)) and not torch.isnan(got).any(), diff


def check_decode_indexer(launch, q, w, cache, key_dtype, block_table, block_size, seq_ids, lens, context) -> str:
    """launch(q, w, lens) against the reference at full and at staggered shorter contexts
    (the -inf mask must follow context_lens exactly), outputs poisoned."""
    requests = len(lens)
    short = lens - torch.arange(requests, device=DEV, dtype=torch.int32) * 7
    ok, diff = True, 0.0
    for lengths in (lens, short):
        with poisoned_outputs():
            got = launch(q, w, lengths)
        ref = indexer_logits_paged_torch(q, w, cache, key_dtype, block_table, block_size, seq_ids, lengths, context)
        matched, d = logits_match(got, ref)
        ok, diff = ok and matched, max(diff, d)
    return f"{'ok' if ok else 'FAIL'} (diff {diff:.1e})"


def indexer_cases(rows: list[Row], requests: int, context: int, heads: int = H_I) -> None:
    block_size = 64
    blocks_per_req = context // block_size
    for key_dtype in ("fp8", "mxfp4"):
        cache = make_indexer_cache(requests * context, key_dtype, block_size)
        block_table = torch.randperm(requests * blocks_per_req, device=DEV).int().reshape(requests, blocks_per_req)
        seq_ids = torch.arange(requests, device=DEV, dtype=torch.int32)
        lens = torch.full((requests,), context, device=DEV, dtype=torch.int32)
        sets = [indexer_query(requests, heads) for _ in range(3)]
        case = f"indexer paged {key_dtype} {requests}x{context} H{heads}"
        flops = 2.0 * requests * context * heads * D_I
        nbytes = requests * context * (indexer_row_bytes(D_I, key_dtype) + 4) + requests * (heads * D_I + 4 * heads)
        eager = bench([lambda q=q, w=w: indexer_logits_paged_torch(q, w, cache, key_dtype, block_table, block_size, seq_ids, lens, context) for q, w in sets])
        rows.append(Row(case, "torch eager", eager, flops, nbytes))
        variants = []
        for cfg in [IndexerConfig(16, 4)] if SMOKE else INDEXER_SWEEP:
            variants.append((f"triton n{cfg.block_n} w{cfg.num_warps} p{cfg.programs_per_sm}/SM s{cfg.num_stages or '-'}",
                             lambda q, w, n, cfg=cfg: indexer_logits_triton(q, w, cache, key_dtype, block_table, seq_ids, n, n,
                                                                            block_size, context, True, cfg)))
        smoke_tiled = [TiledConfig(1, 16, 4), TiledConfig(1, 16, 4, mx_scoring="group_dots", prefetch=True)]
        for tcfg in smoke_tiled if SMOKE else INDEXER_DECODE_TILED[key_dtype]:
            group = f" {tcfg.mx_scoring}" if key_dtype == "mxfp4" else ""
            prefetch = " prefetch" if tcfg.prefetch else ""
            wave = " one wave" if tcfg.one_wave else ""
            variants.append((f"tiled m1 n{tcfg.block_n} w{tcfg.num_warps} p{tcfg.programs_per_sm}/SM "
                             f"s{tcfg.num_stages or '-'}{group}{prefetch}{wave}",
                             lambda q, w, n, cfg=tcfg: indexer_logits_tiled(q, w, cache, key_dtype, block_table, seq_ids, n,
                                                                            block_size, context, cfg)))
        for label, launch in variants:
            q, w = sets[0]
            point = sweep_point(case, label,
                                lambda launch=launch: check_decode_indexer(launch, q, w, cache, key_dtype, block_table,
                                                                           block_size, seq_ids, lens, context),
                                [lambda q=q, w=w, launch=launch: launch(q, w, lens) for q, w in sets])
            if point is not None:
                rows.append(Row(case, f"{label} [{point[0].split()[0]}]", point[1], flops, nbytes, eager))
        del cache
        torch.cuda.empty_cache()


def prefill_indexer_case(key_dtype: str, chunk: int, context: int):
    """One request's last `chunk` prompt tokens of a `context`-token prompt: (cache, block table,
    seq ids, context lengths, query sets). Blocks are shuffled over the cache."""
    block_size = 64
    cache = make_indexer_cache(context, key_dtype, block_size)
    table = torch.randperm(context // block_size, device=DEV).int()[None]
    seq_ids = torch.zeros(chunk, device=DEV, dtype=torch.int32)
    lens = torch.arange(context - chunk + 1, context + 1, device=DEV, dtype=torch.int32)
    return cache, table, block_size, seq_ids, lens, [indexer_query(chunk) for _ in range(2)]


def check_tiled(key_dtype: str, cfg: TiledConfig, fp8_dot: bool) -> str:
    """The tiled kernel against the reference on a small prefill batch with tiles straddling requests."""
    half, second = (128, 9) if SMOKE else (2048, 250)
    cache, table, bs, _, _, _ = prefill_indexer_case(key_dtype, 8, 2 * half)
    table = table.reshape(2, -1)  # two requests of `half` tokens
    seq_ids = torch.tensor([0] * 3 + [1] * second, device=DEV, dtype=torch.int32)
    lens = torch.cat([torch.tensor([5, 6, half], device=DEV), torch.arange(half - second + 1, half + 1, device=DEV)]).int()
    q8, qs = fp8_e4m3_quantize(torch.randn(len(lens), H_I, D_I, device=DEV))
    w = (torch.randn(len(lens), H_I, device=DEV) * qs * (H_I * D_I) ** -0.5).contiguous()
    with poisoned_outputs():
        got = indexer_logits_tiled(q8, w, cache, key_dtype, table, seq_ids, lens, bs, half, cfg, fp8_dot=fp8_dot)
    ok, diff = logits_match(got, indexer_logits_paged_torch(q8, w, cache, key_dtype, table, bs, seq_ids, lens, half))
    return f"{'ok' if ok else 'FAIL'} (diff {diff:.1e})"


# The tiled kernel's prefill configs (and whether the dot is fp8): 4 x 128 with 4 warps at the compiler's
# pipelining depth, other tiles, its next key block's loads prefetched, 8 warps, other grids, one stage
# (the fp8 default: default_tiled_config; and at the MXFP4 default's 8 x 128), the fp16 dot.
PREFILL_SWEEP = ((TiledConfig(4, 128, 4), True), (TiledConfig(2, 128, 4), True), (TiledConfig(8, 128, 4), True),
                 (TiledConfig(4, 64, 4), True), (TiledConfig(4, 128, 4, prefetch=True), True),
                 (TiledConfig(4, 128, 8), True), (TiledConfig(4, 128, 4, 2), True), (TiledConfig(4, 128, 4, 8), True),
                 (TiledConfig(4, 128, 4, num_stages=1), True), (TiledConfig(8, 128, 4, num_stages=1), True),
                 (TiledConfig(4, 128, 4), False),
                 (TiledConfig(2, 128, 4), False))


def indexer_prefill_cases(rows: list[Row], chunk: int, context: int, key_dtypes: tuple[str, ...] = ("fp8", "mxfp4"),
                          fp8_dot_only: bool = False) -> None:
    """A prefill chunk's indexer: the per-token kernel against the tiled one (query tiles sharing keys)."""
    for key_dtype in key_dtypes:
        cache, table, bs, seq_ids, lens, sets = prefill_indexer_case(key_dtype, chunk, context)
        case = f"indexer prefill {key_dtype} {chunk} tok at {context}"
        flops = 2.0 * float(lens.sum()) * H_I * D_I
        nbytes = context * indexer_row_bytes(D_I, key_dtype) + 4.0 * float(lens.sum())
        base = bench([lambda q=q, w=w: indexer_logits_triton(q, w, cache, key_dtype, table, seq_ids, lens, lens, bs,
                                                             context, True, mask_tail=False) for q, w in sets])
        rows.append(Row(case, "per-token kernel", base, flops, nbytes))
        for cfg, fp8_dot in [(TiledConfig(2, 16, 4), False)] if SMOKE else PREFILL_SWEEP:
            if fp8_dot_only and not fp8_dot:
                continue
            label = (f"tiled m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} p{cfg.programs_per_sm}/SM "
                     f"s{cfg.num_stages or '-'}{' prefetch' if cfg.prefetch else ''} "
                     f"{'fp8 dot' if fp8_dot else 'fp16 dot'}")
            point = sweep_point(
                case, label, lambda cfg=cfg, f=fp8_dot: check_tiled(key_dtype, cfg, f),
                [lambda q=q, w=w, cfg=cfg, f=fp8_dot: indexer_logits_tiled(
                    q, w, cache, key_dtype, table, seq_ids, lens, bs, context, cfg, False, f) for q, w in sets])
            if point is not None:
                rows.append(Row(case, f"{label} [{point[0].split()[0]}]", point[1], flops, nbytes, base))
        del cache
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- top-k


# The default config (None) and the variants worth timing at each row size. Past the in-register
# kernel's limit (REGISTER_ROW_MAX_COLS) the defaults alone: the sampled path's variants are timed
# beside the compacting path by benchmarks/topk_determinism.py (its VARIANTS). Up to it, both launch
# shapes: the compacting path at its grid up to 32k columns, and the in-register kernel at 4, 8 or
# 16 warps.
MULTI_LAUNCH, ONE = 0, REGISTER_ROW_MAX_COLS  # single_pass_max_cols that force the multi-launch paths / the single launch
_CUDA = torch.device("cuda")
COMPACTING = replace(default_config(_CUDA, 32768, 1), single_pass_max_cols=MULTI_LAUNCH)
TOPK_SWEEP = {
    1 << 30: (None,),
    REGISTER_ROW_MAX_COLS: (None, COMPACTING) + tuple(
        TopkConfig(4096, 4096, warps, single_pass_max_cols=ONE) for warps in (4, 8, 16)),
}


def topk_label(cfg: TopkConfig | None, n_rows: int, n_cols: int) -> str:
    if cfg is None:
        cfg = default_config(torch.device(DEV), n_cols, n_rows)
        return f"triton default ({topk_label(cfg, n_rows, n_cols).removeprefix('triton ')})"
    if takes_register_launch(cfg, n_cols):
        return f"triton 1 launch in registers w{cfg.num_warps}"
    grid = f"chunk{cfg.chunk} block{cfg.block} w{cfg.num_warps} p{cfg.programs_per_sm}/SM"
    if cfg.hist_block:
        grid += f" hist.block{cfg.hist_block}"
    if cfg.sample:
        return f"triton sampled {grid} sample{cfg.sample} list{cfg.candidates}"
    return f"triton compacting {grid} finish{cfg.finish_block}"


def check_topk(cases: list[tuple[torch.Tensor, torch.Tensor]], k: int, cfg: TopkConfig | None) -> str:
    """Selected values equal the reference's per row, -1 padding counts equal, indices below the length."""
    ok = True
    for x, lengths in cases:
        with poisoned_outputs():
            got = topk_triton(x, lengths, k, cfg)
        ref = topk_indices_torch(x, lengths, k)
        gv = torch.where(got >= 0, torch.gather(x, 1, got.long().clamp(min=0)), -1.0).sort(dim=1).values
        rv = torch.where(ref >= 0, torch.gather(x, 1, ref.long().clamp(min=0)), -1.0).sort(dim=1).values
        ok = ok and torch.equal(gv, rv) and torch.equal((got < 0).sum(1), (ref < 0).sum(1)) and bool((got < lengths[:, None]).all())
    return "ok" if ok else "FAIL"


def crowded_rows(x: torch.Tensor) -> torch.Tensor:
    """x with its rows' values crowded or tied: every row overflows the compacting path's
    candidate list (its fallback), and rows of one value stress the ties."""
    out = x.clone()
    out[0::2] = 1.0
    out[1::2] = 1.0 + 1e-4 * torch.randn_like(out[1::2])
    return out


def topk_cases(rows: list[Row], n_rows: int, n_cols: int, k: int | None = None, length: int | None = None) -> None:
    """Every config of TOPK_SWEEP at one shape, k (default TOPK) of each row's first `length`
    columns (default all), eager and replayed in a CUDA graph, beside torch.topk."""
    k = k or TOPK
    length = length or n_cols
    sets = [torch.randn(n_rows, n_cols, device=DEV).clamp_min_(0) for _ in range(8)]  # ReLU-like ties
    lens = torch.full((n_rows,), length, device=DEV, dtype=torch.int32)
    case = f"topk {k} of {n_rows}x{n_cols}" + (f" len {length}" if length < n_cols else "")
    nbytes = n_rows * length * 4 + n_rows * k * 4
    plain = bench([lambda x=x: torch.topk(x[:, :length], k, dim=1) for x in sets])
    rows.append(Row(case, "torch.topk of the first len columns", plain, 0, nbytes))
    if not SMOKE:
        graphed = triton.testing.do_bench_cudagraph(lambda: torch.topk(sets[0][:, :length], k, dim=1), rep=200,
                                                    return_mode="median")
        rows.append(Row(case, "torch.topk of the first len columns [graph]", graphed, 0, nbytes))
    eager = bench([lambda x=x: topk_indices_torch(x, lens, k) for x in sets])
    rows.append(Row(case, "torch eager (reference)", eager, 0, nbytes))
    x = torch.randn(n_rows, n_cols, device=DEV).clamp_min_(0)
    short = torch.randint(0, length + 1, (n_rows,), device=DEV, dtype=torch.int32)
    edge = torch.tensor([0, k - 1, k, k + 1], device=DEV, dtype=torch.int32)
    short[: min(4, n_rows)] = edge[: min(4, n_rows)]
    crowded = crowded_rows(x)
    checks = [(x, lens), (x, short), (crowded, lens)]
    smoke = (TopkConfig(512, 256, 4, single_pass_max_cols=ONE),
             TopkConfig(512, 256, 4, single_pass_max_cols=MULTI_LAUNCH, candidates=256),
             TopkConfig(512, 256, 4, single_pass_max_cols=MULTI_LAUNCH, candidates=256, hist_block=1024),
             TopkConfig(512, 256, 4, single_pass_max_cols=MULTI_LAUNCH, candidates=256, sample=128))
    sweep = TOPK_SWEEP[min(size for size in TOPK_SWEEP if size >= n_cols)]
    for cfg in smoke if SMOKE else sweep:
        label = topk_label(cfg, n_rows, n_cols)
        point = sweep_point(case, label, lambda cfg=cfg: check_topk(checks, k, cfg),
                            [lambda x=x, cfg=cfg: topk_triton(x, lens, k, cfg) for x in sets])
        if point is not None:
            rows.append(Row(case, f"{label} [{point[0]}]", point[1], 0, nbytes, plain))
        if point is not None and not SMOKE:  # as a decode step runs it: replayed in a CUDA graph, no launch cost
            graphed = triton.testing.do_bench_cudagraph(lambda cfg=cfg: topk_triton(x, lens, k, cfg), rep=200,
                                                        return_mode="median")
            rows.append(Row(case, f"{label} [graph]", graphed, 0, nbytes, plain))
            print(f"{case} {label}: graph {graphed * 1e3:.1f} us", flush=True)
    if not SMOKE:  # what the default costs when rows crowd or tie (the compacting path's list overflows)
        graphed = triton.testing.do_bench_cudagraph(lambda: topk_triton(crowded, lens, k), rep=200,
                                                    return_mode="median")
        rows.append(Row(case, f"{topk_label(None, n_rows, n_cols)}, crowded rows [graph]", graphed, 0, nbytes, plain))


def prefill_topk_cases(rows: list[Row], chunk: int, context: int, k: int | None = None) -> None:
    """A prefill chunk's top-k as the engine asks for it (cache slots, `topk_slots`): the chunk's
    last token sees `context` columns, each earlier one a column less. The torch path behind its
    length mask, then the slots mapped (what prefill chunks ran up to this change), against the
    Triton default (the sampled path past 8,192 columns, which writes the slots itself); both
    checked against the reference first (plain and ReLU'd rows; rows of one value, which the
    sampled path finishes over the row), timed eager as prefill runs, rotating two input sets."""
    k = k or TOPK
    lens = torch.arange(context - chunk + 1, context + 1, device=DEV, dtype=torch.int32)
    bs = 16 if SMOKE else 64
    table = torch.randperm(triton.cdiv(context, bs), device=DEV).int()[None]
    slots = SlotMap(table, torch.zeros(chunk, device=DEV, dtype=torch.int32), bs)
    case = f"topk prefill {k} of {chunk}x{context}, ragged"
    nbytes = 4.0 * float(lens.sum()) + chunk * k * 4

    def torch_path(x: torch.Tensor) -> torch.Tensor:
        return positions_to_slots(topk_indices_torch(x, lens, k), table, slots.seq_ids, bs, backend="triton")

    def triton_path(x: torch.Tensor) -> torch.Tensor:
        return topk_triton(x, lens, k, slots=slots)

    x = torch.randn(chunk, context, device=DEV)
    ok = check_topk([(x, lens), (x.clamp_min(0), lens)], k, None) == "ok"
    ok = ok and torch.equal(triton_path(x).sort(dim=1).values, torch_path(x).sort(dim=1).values)
    tied = x.clone()
    tied[::97] = 1.0  # a few rows of one value: the sampled path's fallback
    ok = ok and check_topk([(tied, lens)], k, None) == "ok"
    verdict = "ok" if ok else "FAIL"
    del x, tied
    sets = [torch.randn(chunk, context, device=DEV) for _ in range(2)]
    base = bench([lambda x=x: torch_path(x) for x in sets])
    rows.append(Row(case, "torch.topk masked + positions_to_slots (prefill before)", base, 0, nbytes))
    ms = bench([lambda x=x: triton_path(x) for x in sets])
    label = topk_label(None, chunk, context).removeprefix("triton default (").removesuffix(")")
    rows.append(Row(case, f"triton default with slots: {label} [{verdict}]", ms, 0, nbytes, base))
    print(f"{case}: check {verdict}, torch path {base * 1e3:.0f} us, triton {ms * 1e3:.0f} us", flush=True)
    del sets
    torch.cuda.empty_cache()


def topk_slots_cases(rows: list[Row], n_rows: int, n_cols: int, k: int, length: int, block_size: int = 64) -> None:
    """The top-k as a decode step's attention runs it: positions mapped to cache slots through a
    shuffled block table, by topk_triton then positions_to_slots (two launches) or by topk_triton
    with the mapping (one launch on the in-register path), the default and 4/16 warps; checked
    (slots equal to the two launches', positions' values to the reference's), replayed in a CUDA graph."""
    x = torch.randn(n_rows, n_cols, device=DEV).clamp_min_(0)
    lens = torch.full((n_rows,), length, device=DEV, dtype=torch.int32)
    short = lens.clone()
    short[: min(4, n_rows)] = torch.tensor([0, k - 1, k, k + 1], device=DEV, dtype=torch.int32)[: min(4, n_rows)]
    blocks = triton.cdiv(n_cols, block_size)
    table = torch.randperm(n_rows * blocks, device=DEV).int().reshape(n_rows, blocks)
    slots = SlotMap(table, torch.randperm(n_rows, device=DEV).int(), block_size)
    case = f"topk slots {k} of {n_rows}x{n_cols}" + (f" len {length}" if length < n_cols else "")
    nbytes = n_rows * length * 4 + n_rows * k * 4

    def two_launches(cfg: TopkConfig | None, lengths: torch.Tensor, rows_: torch.Tensor = x) -> torch.Tensor:
        top = topk_triton(rows_, lengths, k, cfg)
        return positions_to_slots(top, table, slots.seq_ids, block_size, backend="triton")

    def check(cfg: TopkConfig | None) -> str:
        ok = True
        for rows_, lengths in ((x, lens), (x, short), (crowded_rows(x), lens)):
            with poisoned_outputs():
                got = topk_triton(rows_, lengths, k, cfg, slots=slots)
            ok = ok and torch.equal(got, two_launches(cfg, lengths, rows_))
            ok = ok and check_topk([(rows_, lengths)], k, cfg) == "ok"
        return "ok" if ok else "FAIL"

    base = None
    warps = () if SMOKE else (4, 16)
    for cfg in (None, *(replace(default_config(x.device, n_cols, n_rows), num_warps=w) for w in warps)):
        label = topk_label(cfg, n_rows, n_cols)
        verdict = check(cfg)
        for name, fn in (("topk + positions_to_slots", lambda cfg=cfg: two_launches(cfg, lens)),
                         ("topk with slots", lambda cfg=cfg: topk_triton(x, lens, k, cfg, slots=slots))):
            ms = bench([fn]) if SMOKE else triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
            base = base or ms
            rows.append(Row(case, f"{label}, {name} [{verdict}] [graph]", ms, 0, nbytes, base))
            print(f"{case} {label}, {name}: check {verdict}, graph {ms * 1e3:.2f} us", flush=True)


# ---------------------------------------------------------------- fp8 quantisation


def quant_cases(rows: list[Row], n_rows: int) -> None:
    """The indexer's per-layer query quantisation (T x 64 heads x 128): one kernel vs torch ops."""
    from kernels.quant import mxfp4_quantize

    sets = [torch.randn(n_rows, H_I, D_I, device=DEV) * torch.rand(n_rows, H_I, 1, device=DEV) * 10 for _ in range(3)]
    case = f"fp8 quantize {n_rows}x{H_I}x{D_I}"
    nbytes = n_rows * H_I * (D_I * 5 + 4)
    eager = bench([lambda x=x: fp8_e4m3_quantize(x, backend="torch") for x in sets])
    rows.append(Row(case, "torch eager", eager, 0, nbytes))
    ok = True
    for x in sets + [torch.randn(7, 16, device=DEV).bfloat16()]:
        with poisoned_outputs():
            q, s = fp8_e4m3_quantize(x, backend="triton")
        rq, rs = fp8_e4m3_quantize(x, backend="torch")
        ok = ok and torch.equal(q, rq) and torch.equal(s, rs)
    ms = bench([lambda x=x: fp8_e4m3_quantize(x, backend="triton") for x in sets])
    print(f"{case}: check {'ok (bit-identical)' if ok else 'FAIL'}, {ms * 1e3:.1f} us", flush=True)
    rows.append(Row(case, f"triton one kernel [{'ok' if ok else 'FAIL'}]", ms, 0, nbytes, eager))
    # the indexer keys of a 2k-token prefill chunk in MXFP4
    keys = [torch.randn(2048, D_I, device=DEV) * torch.rand(2048, 1, device=DEV) * 10 for _ in range(3)]
    case = f"mxfp4 quantize 2048x{D_I}"
    nbytes = 2048 * (D_I * 4 + D_I // 2 + D_I // 32)
    eager = bench([lambda x=x: mxfp4_quantize(x, backend="torch") for x in keys])
    rows.append(Row(case, "torch eager", eager, 0, nbytes))
    ok = True
    for x in keys + [torch.randn(5, 32, device=DEV).bfloat16() * 1e-3]:
        with poisoned_outputs():
            got = mxfp4_quantize(x, backend="triton")
        ok = ok and torch.equal(got, mxfp4_quantize(x, backend="torch"))
    ms = bench([lambda x=x: mxfp4_quantize(x, backend="triton") for x in keys])
    print(f"{case}: check {'ok (bit-identical)' if ok else 'FAIL'}, {ms * 1e3:.1f} us", flush=True)
    rows.append(Row(case, f"triton one kernel [{'ok' if ok else 'FAIL'}]", ms, 0, nbytes, eager))


# ---------------------------------------------------------------- decode projections (GEMV)

# (name, heads, N, K, weight transposed) of each model's projections at decode: the fused input and
# query projections, W_UK (a transposed per-head view: it reduces over the weight's rows) and W_UV,
# the output projection, the fused gate/up, down, and the LM head.
GEMV_SHAPES = {
    "small": [("input_proj", 1, 1232, 2048, False), ("query_proj", 1, 5120, 512, False), ("W_UK", 16, 512, 128, True),
              ("W_UV", 16, 128, 512, False), ("wo", 1, 2048, 2048, False), ("gate_up", 1, 11264, 2048, False),
              ("down", 1, 2048, 5632, False), ("lm_head", 1, 32768, 2048, False)],
    "v32": [("input_proj", 1, 2304, 7168, False), ("query_proj", 1, 32768, 1536, False), ("W_UK", 128, 512, 128, True),
            ("W_UV", 128, 128, 512, False), ("wo", 1, 7168, 16384, False), ("gate_up", 1, 36864, 7168, False),
            ("down", 1, 7168, 18432, False), ("lm_head", 1, 129280, 7168, False)],
}
# The configs the sweep tries besides the default: fp32 multiply-adds for one row, tl.dot for more.
GEMV_FMA_SWEEP = [gemv.GemvConfig(4, 2048), gemv.GemvConfig(8, 1024), gemv.GemvConfig(8, 2048, 8), gemv.GemvConfig(16, 1024, 8),
                  gemv.GemvConfig(16, 512), gemv.GemvConfig(32, 512, 8)]
GEMV_DOT_SWEEP = [gemv.GemvConfig(bn, bk, w, True, 16, st) for bn, bk, w, st in
                  ((16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (64, 256, 8, 3))]
# The dot kernel's tiles (block_n, block_k, warps, stages) tried at decode batches past DOT_ROWS rows.
GEMV_BATCH_TILES = ((32, 128, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 4), (64, 64, 8, 5))


def graph_ms(fns: list) -> float:
    """Median ms per call of the functions captured back to back in one CUDA graph (as a decode
    step's graph runs them), each reading its own weights so the L2 holds none of them. The graph
    replays for ~20 ms before the timed replays: a kernel compiled just before would otherwise run
    at the clock the GPU dropped to while the host compiled."""
    if SMOKE:
        return bench(fns)
    for f in fns:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()

    def replays(count: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / count

    replays(max(1, int(20 / replays(1))))
    times = sorted(replays(3) / len(fns) for _ in range(5))
    return times[len(times) // 2]


def gemv_check(fn, ref: torch.Tensor) -> str:
    """Poisoned output against the fp32 product: within bf16 rounding of each element plus 1 % of the largest."""
    with poisoned_outputs():
        got = fn().float()
    err = (got - ref).abs()
    ok = not torch.isnan(got).any() and bool((err <= ref.abs() / 128 + 1e-2 * ref.abs().max()).all())
    return f"{'ok' if ok else 'FAIL'} (max err {float(err.max()):.2e})"


def gemv_batch_sweep(m: int) -> list[gemv.GemvConfig]:
    """The dot kernel's tiles tried at m rows (more than DOT_ROWS), every row in one tile."""
    return [gemv.GemvConfig(bn, bk, w, True, triton.next_power_of_2(m), st) for bn, bk, w, st in GEMV_BATCH_TILES]


def gemv_cases(rows: list[Row], model: str, row_counts: tuple[int, ...], sweep: bool = True) -> None:
    """cuBLAS (F.linear / einsum; the LM head's .float() after it, as its fp32 logits need) against
    the Triton GEMV per projection shape and row count, in CUDA graphs. Past DOT_ROWS rows the sweep
    runs at the first such row count and its fastest config alone at the later ones."""
    for name, heads, n, k, transposed in GEMV_SHAPES[model]:
        if SMOKE:
            n, k = max(16, n // 64), max(16, k // 64)
        nbytes_w = heads * n * k * 2
        copies = 2 if SMOKE else max(2, min(48, -(-(256 << 20) // nbytes_w)))
        weights = [torch.randn(heads, k, n, device=DEV).bfloat16().transpose(1, 2) if transposed
                   else torch.randn(heads, n, k, device=DEV).bfloat16() for _ in range(copies)]
        out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16
        best: tuple[float, gemv.GemvConfig] | None = None  # the fastest config past DOT_ROWS rows
        for m in row_counts:
            x = torch.randn(m, heads, k, device=DEV).bfloat16()
            case = f"gemv {model} {name} M{m} ({heads}x{n}x{k})"
            flops, nbytes = 2.0 * m * heads * n * k, nbytes_w + 2 * m * heads * (n + k)
            ref = torch.einsum("thk,hnk->thn", x.float(), weights[0].float())
            if heads == 1:
                cublas = [lambda w=w: F.linear(x[:, 0], w[0]).to(out_dtype) for w in weights]
            else:
                cublas = [lambda w=w: torch.einsum("thk,hnk->thn", x, w) for w in weights]
            base = graph_ms(cublas)
            print(f"{case} cuBLAS: check {gemv_check(cublas[0], ref.view_as(cublas[0]()))}, {base * 1e3:.1f} us", flush=True)
            rows.append(Row(case, "cuBLAS", base, flops, nbytes))
            default = gemv.default_config(n, k, m)
            configs = [default] if default is not None else []
            if best is not None:
                configs += [c for c in (replace(best[1], block_m=triton.next_power_of_2(m)),) if c != default]
            elif sweep:
                swept = (GEMV_FMA_SWEEP if m == 1 else []) + (GEMV_DOT_SWEEP if m <= gemv.DOT_ROWS else gemv_batch_sweep(m))
                configs += [c for c in swept if c != default]
            for cfg in configs:
                label = (f"{'default ' if cfg == default else ''}{'dot' if cfg.dot else 'fma'} m{cfg.block_m} "
                         f"n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps}{f' s{cfg.num_stages}' if cfg.dot else ''}")

                def run(w, cfg=cfg):
                    out = torch.empty(m, heads, n, device=DEV, dtype=out_dtype)
                    gemv.launch(x, w, out, cfg)
                    return out

                point = sweep_point(case, label, lambda cfg=cfg: gemv_check(lambda: run(weights[0]), ref),
                                    [lambda w=w: run(w) for w in weights], timer=graph_ms)
                if point is not None:
                    rows.append(Row(case, f"{label} [{point[0].split()[0]}]", point[1], flops, nbytes, base))
                    if m > gemv.DOT_ROWS and point[0].startswith("ok") and (best is None or point[1] < best[0]):
                        best = point[1], cfg
            if best is not None and m == row_counts[0]:
                print(f"gemv best {model} {name} ({n}x{k}) M{m}: {best[1]!r} {best[0] * 1e3:.1f} us vs cuBLAS "
                      f"{base * 1e3:.1f} us", flush=True)
        del weights
        if not SMOKE:
            torch.cuda.empty_cache()


def argmax_cases(rows: list[Row], n_rows: int, n_cols: int) -> None:
    """torch.argmax against the Triton argmax (its default and other block sizes) over fp32 logits, in CUDA graphs."""
    case = f"argmax {n_rows}x{n_cols}"
    sets = [torch.randn(n_rows, n_cols, device=DEV) for _ in range(2 if SMOKE else 8)]
    ref = sets[0].argmax(dim=-1)
    base = graph_ms([lambda x=x: x.argmax(dim=-1) for x in sets])
    rows.append(Row(case, "torch.argmax", base, 0, 4.0 * n_rows * n_cols))
    print(f"{case} torch.argmax: {base * 1e3:.1f} us", flush=True)
    configs = [(argmax.BLOCK, argmax.NUM_WARPS)] + ([] if SMOKE else [(4096, 8), (8192, 8), (16384, 16), (32768, 16)])
    for block, warps in configs:
        label = f"{'default ' if (block, warps) == configs[0] else ''}triton block {block} w{warps}"

        def run(x: torch.Tensor, block: int = block, warps: int = warps) -> torch.Tensor:
            out = torch.empty(x.shape[0], dtype=torch.int64, device=DEV)
            argmax._argmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=min(block, triton.next_power_of_2(n_cols)),
                                                 num_warps=warps)
            return out

        point = sweep_point(case, label, lambda run=run: "ok" if torch.equal(run(sets[0]), ref) else "FAIL",
                            [lambda x=x, run=run: run(x) for x in sets], timer=graph_ms)
        if point is not None:
            rows.append(Row(case, f"{label} [{point[0]}]", point[1], 0, 4.0 * n_rows * n_cols, base))
# ---------------------------------------------------------------- GEMVs with the small op in their x-load

# (name, N, K, prologue) of the small model's folds at batch 1 (kernels/gemv_fused.py): the pre-norms
# with the residual add, q_norm alone, silu(gate) * up; and the configs each prologue's sweep tries.
GEMV_FUSED_SHAPES = [("input_proj", 1232, 2048, "add_norm"), ("gate_up", 11264, 2048, "add_norm"),
                     ("query_proj", 5120, 512, "norm"), ("down", 2048, 5632, "silu_mul")]
GEMV_FUSED_SWEEP = {"add_norm": [gemv.GemvConfig(4, 2048), gemv.GemvConfig(8, 2048, 8), gemv.GemvConfig(8, 1024),
                                 gemv.GemvConfig(16, 1024, 8)],
                    "norm": [gemv.GemvConfig(4, 512), gemv.GemvConfig(8, 512), gemv.GemvConfig(16, 512)],
                    "silu_mul": [gemv.GemvConfig(4, 2048), gemv.GemvConfig(8, 1024)]}


def gemv_fused_cases(rows: list[Row]) -> None:
    """Per fold, in CUDA graphs at one row: the two launches (the norm or silu kernel, then the GEMV
    or cuBLAS; for q_norm also torch's F.rms_norm) against the fused GEMV, which is checked first
    against the two launches (elements that differ, max difference) and the fp32 product."""
    eps = 1e-6
    for name, n, k, prologue in GEMV_FUSED_SHAPES:
        if SMOKE:
            n, k = max(16, n // 64), max(16, k // 64)
        copies = 2 if SMOKE else max(2, min(48, -(-(256 << 20) // (n * k * 2))))
        weights = [torch.randn(n, k, device=DEV).bfloat16() / k**0.5 for _ in range(copies)]
        residual, update = (torch.randn(1, k, device=DEV).bfloat16() for _ in range(2))
        update = update if prologue == "add_norm" else None
        norm_w = (1 + 0.1 * torch.randn(k, device=DEV)).bfloat16()
        gate_up = torch.randn(1, 2 * k, device=DEV).bfloat16()
        case = f"gemv_fused small {name}+{prologue} M1 ({n}x{k})"
        flops, nbytes = 2.0 * n * k, n * k * 2 + 2 * (n + 3 * k)

        def two_launches(w, torch_norm=False):
            if prologue == "silu_mul":
                return gemv.linear(silu_mul(gate_up, "triton"), w, "triton")
            if torch_norm:
                return gemv.linear(F.rms_norm(residual, (k,), norm_w, eps), w, "triton")
            return gemv.linear(add_rms_norm(update, residual, norm_w, eps, "triton")[0], w, "triton")

        def fused(w, cfg):
            if prologue == "silu_mul":
                return gemv_fused.launch(cfg, gate_up, w, k, silu_mul=True)
            new_residual = None if update is None else torch.empty_like(residual)
            return gemv_fused.launch(cfg, residual, w, k, update=update, norm_weight=norm_w, eps=eps,
                                     new_residual=new_residual)

        unfused = two_launches(weights[0])
        x = silu_mul(gate_up, "triton") if prologue == "silu_mul" else add_rms_norm(update, residual, norm_w, eps,
                                                                                    "triton")[0]
        ref = F.linear(x.float(), weights[0].float())
        variants = [("two launches", lambda w: two_launches(w))]
        if prologue == "norm":
            variants.append(("torch rms_norm + GEMV/cuBLAS", lambda w: two_launches(w, torch_norm=True)))
        for label, fn in variants:
            base = graph_ms([lambda w=w, fn=fn: fn(w) for w in weights])
            print(f"{case} {label}: {base * 1e3:.1f} us", flush=True)
            rows.append(Row(case, label, base, flops, nbytes))
        default = gemv_fused.prologue_config(n, k, 1) or (gemv.GemvConfig(8, 32) if SMOKE else None)
        configs = [c for c in [default] if c] + [c for c in GEMV_FUSED_SWEEP[prologue] if c != default and not SMOKE]
        for cfg in configs:
            label = f"{'default ' if cfg == default else ''}fused n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps}"

            def check(cfg=cfg):
                got = fused(weights[0], cfg)
                differ = int((got != unfused).sum())
                return f"{gemv_check(lambda: fused(weights[0], cfg), ref)}, {differ} of {n} differ from two launches"

            point = sweep_point(case, label, check, [lambda w=w, cfg=cfg: fused(w, cfg) for w in weights], timer=graph_ms)
            if point is not None:
                rows.append(Row(case, f"{label} [{point[0].split()[0]}]", point[1], flops, nbytes, base))
        del weights
        if not SMOKE:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- report


def print_table(rows: list[Row]) -> None:
    head = f"{'case':<40} {'variant':<52} {'time us':>9} {'TFLOP/s':>8} {'GB/s':>7} {'%copy':>6} {'%mm':>5} {'vs eager':>8}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        tflops = r.flops / r.ms / 1e9
        gbps = r.bytes / r.ms / 1e6
        speed = f"{r.eager_ms / r.ms:.1f}x" if r.eager_ms else ""
        print(
            f"{r.case:<40} {r.variant:<52} {r.ms * 1e3:>9.1f} {tflops:>8.1f} {gbps:>7.0f} "
            f"{100 * gbps / (COPY_TBPS * 1e3):>5.0f}% {100 * tflops / MATMUL_TFLOPS:>4.0f}% {speed:>8}"
        )


# The script's parts: all of them run unless --only names some.
PARTS = ("mla", "indexer", "topk", "topk_slots", "quant", "prefill", "gemv", "argmax", "gemv_fused", "gemv_batch")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=PARTS, action="append", help="run only these parts (repeatable)")
    parser.add_argument("--kv-slots", type=int, default=1 << 20, help="KV cache rows the sparse MLA indices draw from")
    parser.add_argument("--prefill-chunk", type=int, default=2048, help="prefill part: tokens in the chunk")
    parser.add_argument("--prefill-context", type=lambda v: [int(c) for c in v.split(",")], default=[65536],
                        help="prefill part: the indexer's contexts (comma list; the chunk's last token's)")
    parser.add_argument("--prefill-topk-context", type=lambda v: [int(c) for c in v.split(",")], default=[65536],
                        help="prefill part: the top-k's contexts (comma list)")
    parser.add_argument("--prefill-key-dtypes", default="fp8,mxfp4", help="prefill part: indexer key dtypes")
    parser.add_argument("--fp8-dot-only", action="store_true", help="prefill part: skip the fp16-dot variants")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (set TRITON_INTERPRET=1) to test the script")
    args = parser.parse_args(argv)
    global DEV, SMOKE, TOPK
    if args.smoke:
        DEV, SMOKE, TOPK = "cpu", True, 64
    elif not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    parts = args.only or PARTS
    name = "cpu (smoke)" if SMOKE else torch.cuda.get_device_name()
    print(f"device: {name}  torch {torch.__version__}  triton {triton.__version__}")
    copy, mm = measure_ceilings()
    print(f"ceilings measured now: copy {copy:.2f} TB/s, bf16 matmul {mm:.0f} TFLOP/s "
          f"(fractions below use the issue's {COPY_TBPS} TB/s and {MATMUL_TFLOPS:.0f} TFLOP/s)", flush=True)
    torch.manual_seed(0)
    rows: list[Row] = []
    try:  # the table of whatever was measured prints even if a later part fails
        if "mla" in parts:
            sparse_mla_cases(rows, 4096 if SMOKE else args.kv_slots, 2 if SMOKE else 64)
            if not SMOKE:  # a prefill chunk's tokens
                sparse_mla_cases(rows, args.kv_slots, 2048, (128,), ("bf16",))
        if "topk" in parts:
            topk_cases(rows, *((2, 4096) if SMOKE else (64, 65536)))
            if not SMOKE:  # the decode steps' shapes: v32 16 requests at 64k; small (k = 512) 1 and 128 requests
                # at 4k context in rows a little over 4k columns, like benchmarks/engine.py's max_model_len
                # (context + steps + 2; any width in 4,097-8,192 takes the same kernels); rows up to the
                # in-register kernel's limit (REGISTER_ROW_MAX_COLS), where the launch shapes meet
                topk_cases(rows, 16, 65536)
                for n_cols in (131072, 163840):  # v32 decode at 128k and 160k context: the sampled path
                    topk_cases(rows, 16, n_cols)
                for n_rows in (1, 128):
                    topk_cases(rows, n_rows, 4096 + 54, k=512, length=4096)
                topk_cases(rows, 128, 4096)
                for n_cols in (8192, REGISTER_ROW_MAX_COLS):
                    topk_cases(rows, 1, n_cols)
        if "topk_slots" in parts:  # the small model's decode rows (k 512, 4k context) as cache slots; the
            # engine's rows past 4,096 (benchmarks/engine.py --context 4096: 4,131 columns) take the full block
            for n_rows, n_cols, length in ((2, 700, 600),) if SMOKE else (
                    (1, 4096 + 54, 4096), (1, 4096, 4096), (1, 4096 + 35, 4096 + 14), (32, 4096 + 54, 4096),
                    (128, 4096 + 54, 4096)):
                topk_slots_cases(rows, n_rows, n_cols, 64 if SMOKE else 512, length, 16 if SMOKE else 64)
        if "quant" in parts:
            quant_cases(rows, 2 if SMOKE else 16)
        if "prefill" in parts:  # a prompt's last chunk: indexer and top-k (sparse attention: under mla)
            chunk = 8 if SMOKE else args.prefill_chunk
            for context in (300,) if SMOKE else args.prefill_topk_context:
                prefill_topk_cases(rows, 64 if SMOKE else chunk, context)
            for context in (256,) if SMOKE else args.prefill_context:
                indexer_prefill_cases(rows, chunk, context, tuple(args.prefill_key_dtypes.split(",")),
                                      args.fp8_dot_only)
        if "gemv" in parts:  # the decode steps' projections: small at batch 1, speculative 1 x 4, up to 16 rows
            gemv_cases(rows, "small", (1, 2) if SMOKE else (1, 2, 4, 16), sweep=not SMOKE)
            if not SMOKE:
                gemv_cases(rows, "v32", (1, 16))
        if "gemv_batch" in parts:  # the small model's decode at batch 128, then the rows' lower bound
            gemv_cases(rows, "small", (40, 33) if SMOKE else (128, 40))
        if "argmax" in parts:  # the greedy sampler over a decode step's logits: small (vocab 32,768), v32 (129,280)
            for n_rows, n_cols in ((2, 1000),) if SMOKE else ((1, 32768), (128, 32768), (16, 129280)):
                argmax_cases(rows, n_rows, n_cols)
        if "gemv_fused" in parts:
            gemv_fused_cases(rows)
        if "indexer" in parts:
            indexer_cases(rows, *((2, 512) if SMOKE else (64, 65536)))
            if not SMOKE:  # v32's decode at 64k; small's (16 index heads) at batch 128 x 4k
                indexer_cases(rows, 16, 65536)
                indexer_cases(rows, 128, 4096, heads=16)
    finally:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
