"""Sparse MLA (absorbed MQA form) over gathered cache rows: Triton kernel, split-K combine, torch reference.

o[t, h] = softmax_j(scale * q[t, h] . row[idx[t, j]]) @ row[idx[t, j]][:d_c], lse in fp32 (natural
log); entries with idx -1 take no part; a token with no valid entry gets o = 0, lse = -inf.
The Triton kernel runs one program per (token, block of heads, split of the index list; a
token's head blocks adjacent in the grid): it
gathers BLOCK_N rows, scores them with two dots (latent and rope parts), keeps an exp2 online
softmax (masked scores -1e30, never -inf, so no NaN) and accumulates P @ rows[:, :d_c]. When
(tokens x head blocks) would not fill the GPU the index list is split and a second kernel merges
the partial results weighted by their lse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.quant import DS_MLA_GROUP, KV_DTYPES, kv_row_width, read_kv_rows
from kernels.triton_utils import E4M3_RAW_SCALE, dot_dtype, e4m3_to_raw_f16, f32_to_bf16, new_output, sm_count

LOG2E = tl.constexpr(1.4426950408889634)  # exp2/log2 in the kernels, natural log outside
_REF_CHUNK = 1 << 24  # elements of the gathered [tokens, K, d] rows the reference holds at once


# ---------------------------------------------------------------- torch reference


def sparse_mla_torch(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, scale: float, d_c: int,
                     kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: gather and dequantise the rows, fp32 softmax and products."""
    t, h, width = q.shape
    out = torch.empty(t, h, d_c, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    step = max(1, _REF_CHUNK // max(1, indices.shape[1] * width))
    for lo in range(0, t, step):
        idx = indices[lo : lo + step]
        valid = idx >= 0
        rows = read_kv_rows(kv_cache, idx.clamp(min=0), d_c, width - d_c, kv_dtype)  # [t, K, d]
        logits = scale * torch.einsum("thd,tkd->thk", q[lo : lo + step].float(), rows)
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        chunk_lse = torch.logsumexp(logits, dim=-1)
        probs = torch.exp(logits - chunk_lse.clamp(min=-1e30)[..., None])
        out[lo : lo + step] = torch.einsum("thk,tkc->thc", probs, rows[..., :d_c]).to(torch.bfloat16)
        lse[lo : lo + step] = chunk_lse
    return out, lse


# ---------------------------------------------------------------- Triton kernels


@triton.jit
def _gather_rows(
    kv_ptr, kv_bytes_ptr, kv_words_ptr, slot,
    KV_STRIDE: tl.constexpr, ROW_BYTES: tl.constexpr, ROPE_OFFSET: tl.constexpr,
    D_C: tl.constexpr, D_R: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """Rows at cache slots `slot` [BLOCK_N] (-1: none) as (latent [BLOCK_N, D_C], rope [BLOCK_N, D_R], valid)."""
    valid = slot >= 0
    slot = tl.where(valid, slot, 0).to(tl.int64)
    cols_c = tl.arange(0, D_C)
    if FP8:
        raw = tl.load(kv_bytes_ptr + slot[:, None] * ROW_BYTES + cols_c[None, :], mask=valid[:, None], other=0)
        k_c = e4m3_to_raw_f16(raw.to(tl.int32)).to(tl.float32)  # [BLOCK_N, D_C] = value / 2^8
        # one fp32 scale per 128 values: select it per column (no reshapes, which cost layout shuffles)
        group_scale = tl.zeros((BLOCK_N, D_C), tl.float32)
        for g in tl.static_range(D_C // 128):
            s_g = tl.load(kv_words_ptr + slot * (ROW_BYTES // 4) + D_C // 4 + g, mask=valid, other=0)
            group_scale = tl.where(cols_c[None, :] // 128 == g, s_g.to(tl.float32, bitcast=True)[:, None], group_scale)
        k_c = (k_c * group_scale * E4M3_RAW_SCALE).to(DOT_DTYPE)
    else:
        k_c = tl.load(kv_ptr + slot[:, None] * KV_STRIDE + cols_c[None, :], mask=valid[:, None],
                      other=0.0).to(DOT_DTYPE)
    cols_r = tl.arange(0, D_R)
    k_r = tl.load(kv_ptr + slot[:, None] * KV_STRIDE + ROPE_OFFSET + cols_r[None, :], mask=valid[:, None],
                  other=0.0).to(DOT_DTYPE)
    return k_c, k_r, valid


@triton.jit
def _attend_block(
    q_c, q_r, m, l, acc, kv_ptr, kv_bytes_ptr, kv_words_ptr, slot, sm_scale_log2,
    KV_STRIDE: tl.constexpr, ROW_BYTES: tl.constexpr, ROPE_OFFSET: tl.constexpr,
    D_C: tl.constexpr, D_R: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """One block of rows into the online softmax: the updated (m, l, acc)."""
    k_c, k_r, valid = _gather_rows(kv_ptr, kv_bytes_ptr, kv_words_ptr, slot,
                                   KV_STRIDE, ROW_BYTES, ROPE_OFFSET, D_C, D_R, BLOCK_N, FP8, DOT_DTYPE)
    s = tl.dot(q_c, tl.trans(k_c)) + tl.dot(q_r, tl.trans(k_r))
    s = tl.where(valid[None, :], s * sm_scale_log2, -1e30)
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.where(valid[None, :], tl.exp2(s - m_new[:, None]), 0.0)
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), k_c)
    return m_new, l, acc


@triton.jit
def _split_range(n_idx, BLOCK_N: tl.constexpr):
    """This program's [lo, hi) of the index list: splits take whole blocks of BLOCK_N."""
    per_split = tl.cdiv(tl.cdiv(n_idx, BLOCK_N), tl.num_programs(1)) * BLOCK_N
    lo = tl.program_id(1) * per_split
    return lo, tl.minimum(lo + per_split, n_idx)


@triton.jit
def _store_result(acc, m, l, o_ptr, lse_ptr, t, heads, n_heads, D_C: tl.constexpr, SPLIT: tl.constexpr):
    """Normalise and store o [BLOCK_H, D_C] and lse, or the split's partials (o fp32, lse in log2)."""
    head_ok = heads < n_heads
    cols_c = tl.arange(0, D_C)
    has_any = l > 0
    out = acc / tl.where(has_any, l, 1.0)[:, None]
    lse_log2 = tl.where(has_any, m + tl.log2(tl.where(has_any, l, 1.0)), float("-inf"))
    if SPLIT:  # partials: o fp32 [T, H, S, D_C], lse (log2) [T, H, S]
        part = (t * n_heads + heads) * tl.num_programs(1) + tl.program_id(1)
        tl.store(o_ptr + part[:, None] * D_C + cols_c[None, :], out, mask=head_ok[:, None])
        tl.store(lse_ptr + part, lse_log2, mask=head_ok)
    else:
        row = t * n_heads + heads
        tl.store(o_ptr + row[:, None] * D_C + cols_c[None, :], f32_to_bf16(out), mask=head_ok[:, None])
        tl.store(lse_ptr + row, lse_log2 / LOG2E, mask=head_ok)


@triton.jit
def _sparse_mla_kernel(
    q_c_ptr, q_r_ptr, kv_ptr, kv_bytes_ptr, kv_words_ptr, idx_ptr, o_ptr, lse_ptr,
    q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h, sm_scale_log2, n_idx, n_heads,
    # fixed per model; lets loads vectorise
    KV_STRIDE: tl.constexpr, ROW_BYTES: tl.constexpr, ROPE_OFFSET: tl.constexpr,
    D_C: tl.constexpr, D_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    FP8: tl.constexpr, SPLIT: tl.constexpr, DOT_DTYPE: tl.constexpr, PRELOAD_TILES: tl.constexpr,
):
    # Grid (tokens x head blocks, splits), head blocks fastest: a token's head blocks run side by
    # side and gather the same rows, so the second gather hits the L2 (at 2,048 prefill tokens the
    # head blocks of one token, launched a grid row apart, each read the rows from memory).
    head_blocks = tl.cdiv(n_heads, BLOCK_H)
    t = (tl.program_id(0) // head_blocks).to(tl.int64)
    heads = (tl.program_id(0) % head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < n_heads
    # the query's latent and rotary parts come from two tensors of any row strides (views of the
    # model's projections: no concatenation needed)
    q_c_row = q_c_ptr + t * q_c_stride_t + heads[:, None].to(tl.int64) * q_c_stride_h
    q_r_row = q_r_ptr + t * q_r_stride_t + heads[:, None].to(tl.int64) * q_r_stride_h
    q_c = tl.load(q_c_row + tl.arange(0, D_C)[None, :], mask=head_ok[:, None], other=0.0).to(DOT_DTYPE)
    q_r = tl.load(q_r_row + tl.arange(0, D_R)[None, :], mask=head_ok[:, None], other=0.0).to(DOT_DTYPE)
    lo, hi = _split_range(n_idx, BLOCK_N)
    m = tl.full((BLOCK_H,), -1e30, tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, D_C), tl.float32)
    if PRELOAD_TILES > 0:
        # the indices of PRELOAD_TILES blocks in registers before their loop: a row gather then
        # waits on no load of its own iteration, and the pipeliner issues it num_stages - 1 blocks
        # ahead (with the index load in the loop, block i+1's rows were issued at the end of block
        # i and waited for at once: one block in flight, the gather latency exposed per block)
        tile = tl.arange(0, PRELOAD_TILES)
        for chunk in range(lo, hi, PRELOAD_TILES * BLOCK_N):
            j_chunk = chunk + tile[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            idx_chunk = tl.load(idx_ptr + t * n_idx + j_chunk, mask=j_chunk < hi, other=-1)
            for start in range(chunk, tl.minimum(chunk + PRELOAD_TILES * BLOCK_N, hi), BLOCK_N):
                slot = tl.sum(tl.where(tile[:, None] == (start - chunk) // BLOCK_N, idx_chunk, 0), axis=0)
                m, l, acc = _attend_block(q_c, q_r, m, l, acc, kv_ptr, kv_bytes_ptr, kv_words_ptr, slot,
                                          sm_scale_log2, KV_STRIDE, ROW_BYTES, ROPE_OFFSET, D_C, D_R, BLOCK_N,
                                          FP8, DOT_DTYPE)
    else:
        for start in range(lo, hi, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            slot = tl.load(idx_ptr + t * n_idx + j, mask=j < hi, other=-1)
            m, l, acc = _attend_block(q_c, q_r, m, l, acc, kv_ptr, kv_bytes_ptr, kv_words_ptr, slot, sm_scale_log2,
                                      KV_STRIDE, ROW_BYTES, ROPE_OFFSET, D_C, D_R, BLOCK_N, FP8, DOT_DTYPE)
    _store_result(acc, m, l, o_ptr, lse_ptr, t, heads, n_heads, D_C, SPLIT)


@triton.jit
def _combine_kernel(part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, n_splits, D_C: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # token * n_heads + head
    splits = tl.arange(0, BLOCK_S)
    ok = splits < n_splits
    part_lse = tl.load(part_lse_ptr + row * n_splits + splits, mask=ok, other=float("-inf"))
    top = tl.max(part_lse, axis=0)
    safe_top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.where(ok & (part_lse > float("-inf")), tl.exp2(part_lse - safe_top), 0.0)
    total = tl.sum(weight, axis=0)
    cols = tl.arange(0, D_C)
    part_o = tl.load(part_o_ptr + (row * n_splits + splits[:, None]) * D_C + cols[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(part_o * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + row * D_C + cols, f32_to_bf16(out))
    lse = tl.where(total > 0, (safe_top + tl.log2(tl.where(total > 0, total, 1.0))) / LOG2E, float("-inf"))
    tl.store(lse_ptr + row, lse)



@dataclass(frozen=True)
class SparseMlaConfig:
    """Tile shape and launch parameters of the sparse MLA kernel."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    # blocks whose indices are loaded together ahead of their loop, so row gathers pipeline
    # num_stages - 1 blocks deep; 0: each block's indices load in the loop (one block in flight)
    preload_tiles: int = 0
    # programs per SM the automatic split count aims for when tokens x head blocks leave SMs idle
    programs_per_sm: int = 4


def default_config(n_heads: int, kv_dtype: str, device: torch.device) -> SparseMlaConfig:
    """Interpreter: the smallest legal tiles. GPU: wide head blocks when there are many heads."""
    if device.type == "cpu":
        return SparseMlaConfig(16, 16, 4, 1)
    if n_heads >= 64:  # a 64-head block reads each gathered row once for all its heads
        return SparseMlaConfig(64, 64, 8, 2)
    # fp8 rows decode in registers: smaller row tiles and a deeper pipeline pay off there. No
    # config that fits a batch in one wave (the index preload) is the default: a single wave has
    # no slack, so one slow SM holds up the whole launch (benchmarks/sparse_mla_ab.py --config
    # times candidates against this default).
    return SparseMlaConfig(16, 64, 4, 2) if kv_dtype == "bf16" else SparseMlaConfig(16, 32, 4, 3)


class SplitTiling(Protocol):
    """What the split count reads of a kernel's config (SparseMlaConfig, the Gluon kernel's)."""

    @property
    def block_n(self) -> int: ...

    @property
    def programs_per_sm(self) -> int: ...


def auto_num_splits(programs: int, n_idx: int, cfg: SplitTiling, device: torch.device,
                    partial_ratio: float = 0.0) -> int:
    """Split the index list when the programs would leave SMs idle, up to about cfg.programs_per_sm per SM.

    A nearly full single wave is not split. Each split writes (and the combine reads back) fp32
    partial outputs: `partial_ratio` is their bytes per split over the bytes of the rows the index
    list names, and the splits are capped so the partials written stay under half those bytes.
    The partials grow with the heads and the rows with the indices, so at many heads a few splits'
    partials already rival the rows, and a kernel bound by memory traffic gains nothing from
    filling idle SMs with as much traffic again.
    """
    if device.type != "cuda":
        return 1
    sms = sm_count(device)
    if programs >= 0.75 * sms:
        return 1
    cap = 32 if partial_ratio <= 0 else max(1, int(0.5 / partial_ratio))
    return max(1, min(cfg.programs_per_sm * sms // programs, triton.cdiv(n_idx, cfg.block_n), 32, cap))


def partials_ratio(n_heads: int, d_c: int, n_idx: int, kv_cache: torch.Tensor) -> float:
    """Bytes of one split's fp32 partials (o and lse) over the bytes of the rows the index list names."""
    return n_heads * (d_c + 1) * 4 / max(1, n_idx * kv_cache.shape[1] * kv_cache.element_size())


def kv_views(kv_cache: torch.Tensor, kv_dtype: str, d_c: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The cache as the kernels read it: (bf16 elements, bytes, 32-bit words, the rope's offset in bf16
    elements). fp8_ds_mla rows are latent e4m3 bytes, fp32 scales (read as words) and bf16 rope; a
    bf16 cache is read as bf16 only (the byte and word views are the cache itself, unused)."""
    if kv_dtype == "bf16":
        return kv_cache, kv_cache, kv_cache, d_c
    rope_offset = (d_c + 4 * (d_c // DS_MLA_GROUP)) // 2
    return kv_cache.view(torch.bfloat16), kv_cache, kv_cache.view(torch.int32), rope_offset


def choose_splits(num_splits: int | None, programs: int, n_idx: int, cfg: SplitTiling, kv_cache: torch.Tensor,
                  d_c: int, heads: int, device: torch.device) -> int:
    """The caller's num_splits, else auto_num_splits' choice with the partials' traffic counted."""
    return num_splits or auto_num_splits(programs, n_idx, cfg, device, partials_ratio(heads, d_c, n_idx, kv_cache))


def split_outputs(t: int, h: int, d_c: int, splits: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out bf16 [T, H, d_c], lse [T, H], and where the kernel writes: those, or with splits the fp32
    partials o [T, H, S, d_c] and log2 lse [T, H, S] that combine_splits merges into them)."""
    out = new_output((t, h, d_c), torch.bfloat16, device)
    lse = new_output((t, h), torch.float32, device)
    if splits == 1:
        return out, lse, out, lse
    return (out, lse, new_output((t, h, splits, d_c), torch.float32, device),
            new_output((t, h, splits), torch.float32, device))


def combine_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge the splits' partial outputs (split_outputs' layout) weighted by their lse."""
    t, h, splits, d_c = part_o.shape
    _combine_kernel[(t * h,)](part_o, part_lse, out, lse, splits, D_C=d_c,
                              BLOCK_S=max(2, triton.next_power_of_2(splits)))


def sparse_mla_triton(q_c: torch.Tensor, q_r: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, scale: float,
                      kv_dtype: str, num_splits: int | None = None,
                      config: SparseMlaConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel (and the combine when split) for the query's latent part q_c [T, H, d_c]
    and rotary part q_r [T, H, d_r] (any strides, last dim contiguous); config overrides the tile shape."""
    t, h, d_c = q_c.shape
    d_r = q_r.shape[2]
    n_idx = indices.shape[1]
    cfg = config or default_config(h, kv_dtype, q_c.device)
    head_blocks = triton.cdiv(h, cfg.block_h)
    splits = choose_splits(num_splits, t * head_blocks, n_idx, cfg, kv_cache, d_c, h, q_c.device)
    out, lse, dst_o, dst_lse = split_outputs(t, h, d_c, splits, q_c.device)
    if t == 0:
        return out, lse
    kv, kv_bytes, kv_words, rope_offset = kv_views(kv_cache, kv_dtype, d_c)
    per_program = triton.cdiv(triton.cdiv(n_idx, cfg.block_n), splits)  # blocks, as _split_range counts
    _sparse_mla_kernel[(t * head_blocks, splits)](
        q_c, q_r, kv, kv_bytes, kv_words, indices, dst_o, dst_lse,
        q_c.stride(0), q_c.stride(1), q_r.stride(0), q_r.stride(1), scale * LOG2E.value, n_idx, h,
        KV_STRIDE=kv.shape[1], ROW_BYTES=kv_cache.shape[1] * kv_cache.element_size(), ROPE_OFFSET=rope_offset,
        D_C=d_c, D_R=d_r, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        FP8=kv_dtype == "fp8_ds_mla", SPLIT=splits > 1, DOT_DTYPE=dot_dtype(q_c),
        PRELOAD_TILES=min(cfg.preload_tiles, triton.next_power_of_2(per_program)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        combine_splits(dst_o, dst_lse, out, lse)
    return out, lse


# ---------------------------------------------------------------- public API


def _is_pow2(x: int) -> bool:
    return x >= 16 and x & (x - 1) == 0


def sparse_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    d_c: int,
    kv_dtype: str,
    num_splits: int | None = None,
    backend: str | None = None,
    q_rope: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bf16[T, H, d_c] output latent, fp32[T, H] lse) of sparse absorbed MLA over the cache rows at indices.

    q is bf16[T, H, d_c + d_r]; or, with q_rope bf16[T, H, d_r], q is the latent part alone
    [T, H, d_c] and the kernel reads the two parts where they are (views with any row strides),
    so a caller need not concatenate them."""
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError(f"sparse_mla: q must be bf16[T, H, d_c + d_r], got {q.dtype}{list(q.shape)}")
    if q_rope is not None and (q_rope.dim() != 3 or q_rope.dtype != torch.bfloat16 or q_rope.device != q.device
                               or q_rope.shape[:2] != q.shape[:2] or q.shape[2] != d_c):
        raise ValueError(f"sparse_mla: with q_rope, q must be bf16[T, H, d_c={d_c}] and q_rope bf16[T, H, d_r] on "
                         f"its device, got {q.dtype}{list(q.shape)} and {q_rope.dtype}{list(q_rope.shape)} on "
                         f"{q.device} and {q_rope.device}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"sparse_mla: kv_dtype={kv_dtype!r}: expected one of {KV_DTYPES}")
    d_r = q.shape[2] - d_c if q_rope is None else q_rope.shape[2]
    if not (_is_pow2(d_c) and _is_pow2(d_r)):
        raise ValueError(f"sparse_mla: d_c={d_c} and d_r={d_r} must be powers of two >= 16")
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    width = kv_row_width(d_c, d_r, kv_dtype)
    if kv_cache.dim() != 2 or kv_cache.dtype != dtype or kv_cache.shape[1] != width:
        raise ValueError(f"sparse_mla: kv_cache must be {dtype}[num_slots, {width}] for {kv_dtype}, "
                         f"got {kv_cache.dtype}{list(kv_cache.shape)}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"sparse_mla: indices must be int[T={q.shape[0]}, K], got {list(indices.shape)}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"sparse_mla: num_splits={num_splits} must be >= 1")
    name = resolve_backend(backend, q.device, gluon_kernel=True)
    if name == "torch":
        whole = q if q_rope is None else torch.cat((q, q_rope), dim=-1)
        return sparse_mla_torch(whole, kv_cache, indices, scale, d_c, kv_dtype)
    launch = sparse_mla_triton
    if name == "gluon":
        from kernels.sparse_mla_gluon import sparse_mla_gluon  # imports Gluon only where it is chosen

        launch = sparse_mla_gluon
    q_c, q_r = (q[..., :d_c], q[..., d_c:]) if q_rope is None else (q, q_rope)
    return launch(_last_dim_contiguous(q_c), _last_dim_contiguous(q_r), kv_cache.contiguous(),
                  indices.int().contiguous(), scale, kv_dtype, num_splits)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
