"""Lightning-indexer logits: paged (decode) and ragged (prefill), Triton kernel and torch reference.

I[t, s] = s_k[s] * sum_h w[t, h] * relu(q[t, h] . k[s]) over the keys a row may see, -inf
elsewhere. Queries are e4m3 bytes whose scale is already folded into w; keys are fp8 rows
(e4m3 + one fp32 scale) or MXFP4 rows (e2m1 + ue8m0 per 32 values, scale inside the dot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend, values_checkable
from kernels.quant import decode_e4m3, indexer_row_bytes, read_indexer_keys
from kernels.triton_utils import (
    E2M1_RAW_SCALE,
    E4M3_RAW_SCALE,
    dot_dtype,
    e2m1_to_raw_f16,
    e4m3_to_raw_f16,
    new_output,
    ue8m0_to_f32,
)

_REF_CHUNK = 1 << 24  # elements of the [tokens, heads, keys] score tensor the reference holds at once


# ---------------------------------------------------------------- torch reference


def _scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, key_scale: torch.Tensor) -> torch.Tensor:
    """q fp32[T, H, d], w[T, H], keys fp32[N, d], key_scale[N] -> fp32[T, N] (unmasked)."""
    out = torch.empty(q.shape[0], keys.shape[0], device=q.device)
    step = max(1, _REF_CHUNK // max(1, q.shape[1] * keys.shape[0]))
    for lo in range(0, q.shape[0], step):
        s = torch.einsum("thd,nd->thn", q[lo : lo + step], keys).clamp_min_(0)
        out[lo : lo + step] = torch.einsum("thn,th->tn", s, w[lo : lo + step]) * key_scale
    return out


def indexer_logits_paged_torch(q_fp8, weights, idx_cache, key_dtype, block_table, block_size, seq_ids, context_lens,
                               max_context):
    """Reference for indexer_logits_paged: dequantise each request's keys once, fp32 dots."""
    d_i = q_fp8.shape[-1]
    q, w = decode_e4m3(q_fp8), weights.float()
    out = torch.full((q.shape[0], max_context), float("-inf"), device=q.device)
    pos = torch.arange(max_context, device=q.device)
    for seq in torch.unique(seq_ids).tolist():
        rows = (seq_ids == seq).nonzero().squeeze(1)
        n = int(context_lens[rows].max())
        if n == 0:
            continue
        slots = block_table[seq, pos[:n] // block_size].long() * block_size + pos[:n] % block_size
        keys, key_scale = read_indexer_keys(idx_cache[slots], d_i, key_dtype)
        logits = _scores(q[rows], w[rows], keys, key_scale)
        visible = pos[None, :n] < context_lens[rows, None]
        out[rows, :n] = torch.where(visible, logits, float("-inf"))
    return out


def indexer_logits_ragged_torch(q_fp8, weights, keys, key_dtype, k_start, k_end):
    """Reference for indexer_logits_ragged: all keys dequantised once, fp32 dots, window mask."""
    values, key_scale = read_indexer_keys(keys, q_fp8.shape[-1], key_dtype)
    logits = _scores(decode_e4m3(q_fp8), weights.float(), values, key_scale)
    col = torch.arange(keys.shape[0], device=keys.device)
    visible = (col[None, :] >= k_start[:, None]) & (col[None, :] < k_end[:, None])
    return torch.where(visible, logits, float("-inf"))


# ---------------------------------------------------------------- Triton kernel


@triton.jit(do_not_specialize=["block_size"])
def _indexer_logits_kernel(
    q_ptr, w_ptr, key_ptr, key_words_ptr, out_ptr,
    block_table_ptr, seq_ids_ptr, start_ptr, end_ptr,
    n_cols, block_table_stride, block_size,
    ROW_BYTES: tl.constexpr,  # fixed per model; as a constant it tells the compiler how wide rows can be loaded
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, MXFP4: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    end = tl.load(end_ptr + t)
    if PAGED:
        visible = cols < end
        seq = tl.load(seq_ids_ptr + t).to(tl.int64)
        block = tl.load(block_table_ptr + seq * block_table_stride + cols // block_size, mask=visible, other=0)
    else:  # contiguous keys: block_size is 1 and block is the column itself
        visible = (cols >= tl.load(start_ptr + t)) & (cols < end)
        block = cols // block_size
    # block_size is not specialised (do_not_specialize): were it known to be a multiple of 16, the
    # compiler would take every slot for one and load rows of ROW_BYTES (132: 4-byte aligned) with
    # 16-byte vectors, a misaligned access on the GPU. Invisible columns are masked, never read.
    slots = block.to(tl.int64) * block_size + cols % block_size
    row = key_ptr + slots[:, None] * ROW_BYTES

    heads = tl.arange(0, BLOCK_H)
    q_row = q_ptr + t * H * D + heads[:, None] * D
    if MXFP4:
        # byte i of a row holds elements 2i (low nibble) and 2i+1 (high nibble): score the even and
        # odd elements as two half-width dots instead of interleaving the nibbles
        half = tl.arange(0, D // 2)
        q_even = e4m3_to_raw_f16(tl.load(q_row + 2 * half[None, :], mask=heads[:, None] < H, other=0).to(tl.int32))
        q_odd = e4m3_to_raw_f16(tl.load(q_row + 2 * half[None, :] + 1, mask=heads[:, None] < H, other=0).to(tl.int32))
        q_even = (q_even.to(tl.float32) * E4M3_RAW_SCALE).to(DOT_DTYPE)
        q_odd = (q_odd.to(tl.float32) * E4M3_RAW_SCALE).to(DOT_DTYPE)
        packed = tl.load(row + half[None, :], mask=visible[:, None], other=0).to(tl.int32)
        scale_byte = tl.load(row + D // 2 + half[None, :] // 16, mask=visible[:, None], other=0).to(tl.int32)
        scale = ue8m0_to_f32(scale_byte) * E2M1_RAW_SCALE
        k_even = (e2m1_to_raw_f16(packed & 0xF).to(tl.float32) * scale).to(DOT_DTYPE)
        k_odd = (e2m1_to_raw_f16(packed >> 4).to(tl.float32) * scale).to(DOT_DTYPE)
        scores = tl.dot(k_even, tl.trans(q_even)) + tl.dot(k_odd, tl.trans(q_odd))  # [BLOCK_N, BLOCK_H]
    else:
        dims = tl.arange(0, D)
        q_raw = e4m3_to_raw_f16(tl.load(q_row + dims[None, :], mask=heads[:, None] < H, other=0).to(tl.int32))
        q = (q_raw.to(tl.float32) * E4M3_RAW_SCALE).to(DOT_DTYPE)
        # fp8 rows are d_I + 4 bytes, d_I a multiple of 16: the scale is word d_I/4 of the row. It is
        # positive, so it can scale the key before the ReLU; e4m3 times a power of two is exact in bf16.
        scale_bits = tl.load(key_words_ptr + slots * (ROW_BYTES // 4) + D // 4, mask=visible, other=0)
        key_scale = scale_bits.to(tl.float32, bitcast=True) * E4M3_RAW_SCALE
        raw = e4m3_to_raw_f16(tl.load(row + dims[None, :], mask=visible[:, None], other=0).to(tl.int32))
        keys = (raw.to(tl.float32) * key_scale[:, None]).to(DOT_DTYPE)
        scores = tl.dot(keys, tl.trans(q))  # [BLOCK_N, BLOCK_H], exact products, fp32 sums

    w = tl.load(w_ptr + t * H + heads, mask=heads < H, other=0.0)
    logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :], axis=1)
    logits = tl.where(visible, logits, float("-inf"))
    tl.store(out_ptr + t.to(tl.int64) * n_cols + cols, logits, mask=cols < n_cols)


@dataclass(frozen=True)
class IndexerConfig:
    """Keys per program and warps of the indexer kernel."""

    block_n: int
    num_warps: int


def default_config(key_dtype: str, device: torch.device) -> IndexerConfig:
    """Measured best on an H200 at 64 requests x 64k keys (benchmarks/kernels_notes.md)."""
    if device.type != "cuda":
        return IndexerConfig(16, 4)
    return IndexerConfig(64, 4) if key_dtype == "fp8" else IndexerConfig(256, 8)


def indexer_logits_triton(q_fp8, weights, rows, key_dtype, block_table, seq_ids, start, end, block_size, n_cols, paged,
                          config=None):
    """Launch the kernel on prepared (contiguous, int32) inputs; config overrides the tile shape."""
    t, h, d = q_fp8.shape
    out = new_output((t, n_cols), torch.float32, q_fp8.device)
    if t == 0 or n_cols == 0:
        return out
    cfg = config or default_config(key_dtype, q_fp8.device)
    words = rows.view(torch.int32) if key_dtype == "fp8" else rows
    grid = (t, triton.cdiv(n_cols, cfg.block_n))
    _indexer_logits_kernel[grid](
        q_fp8, weights, rows, words, out,
        block_table, seq_ids, start, end,
        n_cols, block_table.stride(0), block_size,
        ROW_BYTES=rows.shape[1], H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)), BLOCK_N=cfg.block_n,
        PAGED=paged, MXFP4=key_dtype == "mxfp4", DOT_DTYPE=dot_dtype(q_fp8),
        num_warps=cfg.num_warps,
    )
    return out


# ---------------------------------------------------------------- public API


def _check_inputs(q_fp8: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, key_dtype: str, name: str) -> None:
    if q_fp8.dtype != torch.uint8 or q_fp8.dim() != 3:
        raise ValueError(f"{name}: q_fp8 must be uint8[T, H_I, d_I], got {q_fp8.dtype}{list(q_fp8.shape)}")
    t, h, d = q_fp8.shape
    if d < 16 or d & (d - 1):
        raise ValueError(f"{name}: d_I={d} must be a power of two >= 16")
    if weights.shape != (t, h):
        raise ValueError(f"{name}: weights must be [T, H_I] = {[t, h]}, got {list(weights.shape)}")
    row = indexer_row_bytes(d, key_dtype)
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != row:
        raise ValueError(f"{name}: key rows must be uint8[N, {row}] for d_I={d} {key_dtype}, "
                         f"got {rows.dtype}{list(rows.shape)}")


def indexer_logits_paged(
    q_fp8: torch.Tensor,
    weights: torch.Tensor,
    idx_cache: torch.Tensor,
    key_dtype: str,
    block_table: torch.Tensor,
    block_size: int,
    seq_ids: torch.Tensor,
    context_lens: torch.Tensor,
    max_context: int,
    backend: str | None = None,
) -> torch.Tensor:
    """fp32[T, max_context] logits of each query token over its request's paged keys (-inf past context_lens[t])."""
    _check_inputs(q_fp8, weights, idx_cache, key_dtype, "indexer_logits_paged")
    t = q_fp8.shape[0]
    if seq_ids.shape != (t,) or context_lens.shape != (t,):
        raise ValueError(f"indexer_logits_paged: seq_ids and context_lens must be [T={t}]")
    # a host sync on a GPU (values_checkable): there the caller's host-side max_context stands for it
    visible = min(max_context, block_table.shape[1] * block_size)
    if t and values_checkable(context_lens) and int(context_lens.max()) > visible:
        raise ValueError("indexer_logits_paged: a context_lens entry exceeds max_context or the block table")
    if resolve_backend(backend, q_fp8.device) == "torch":
        return indexer_logits_paged_torch(q_fp8, weights, idx_cache, key_dtype, block_table, block_size, seq_ids,
                                          context_lens, max_context)
    return indexer_logits_triton(
        q_fp8.contiguous(), weights.float().contiguous(), idx_cache.contiguous(), key_dtype,
        block_table.int().contiguous(), seq_ids.int().contiguous(), context_lens.int(), context_lens.int().contiguous(),
        block_size, max_context, paged=True,
    )


def indexer_logits_ragged(
    q_fp8: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_dtype: str,
    k_start: torch.Tensor,
    k_end: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """fp32[T, N] logits of each query token over contiguous keys k_start[t] <= s < k_end[t] (-inf elsewhere)."""
    _check_inputs(q_fp8, weights, keys, key_dtype, "indexer_logits_ragged")
    t = q_fp8.shape[0]
    if k_start.shape != (t,) or k_end.shape != (t,):
        raise ValueError(f"indexer_logits_ragged: k_start and k_end must be [T={t}]")
    if resolve_backend(backend, q_fp8.device) == "torch":
        return indexer_logits_ragged_torch(q_fp8, weights, keys, key_dtype, k_start, k_end)
    start, end = k_start.int().contiguous(), k_end.int().contiguous()
    return indexer_logits_triton(
        q_fp8.contiguous(), weights.float().contiguous(), keys.contiguous(), key_dtype,
        start, start, start, end, 1, keys.shape[0], paged=False,
    )
