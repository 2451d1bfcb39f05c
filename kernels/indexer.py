"""Lightning-indexer logits: paged (decode) and ragged (prefill), Triton kernel and torch reference.

I[t, s] = s_k[s] * sum_h w[t, h] * relu(q[t, h] . k[s]) over the keys a row may see, -inf
elsewhere. Queries are e4m3 bytes whose scale is already folded into w; keys are fp8 (e4m3 + one
fp32 scale) or MXFP4 (e2m1 + ue8m0 per 32 values, scale inside the dot) in the indexer key cache's
blocks (kernels/quant.py: a block's values, then its scale words); ragged keys are a cache of
one-key blocks, [values ; scale word] rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend, values_checkable
from kernels.indexer_decode import descriptor_decode_config, indexer_decode_descriptor
from kernels.indexer_tiled import decode_tiled_config, indexer_logits_tiled
from kernels.quant import decode_e4m3, gather_indexer_rows, indexer_row_bytes, indexer_value_bytes, read_indexer_keys
from kernels.quant_kernels import key_words
from kernels.triton_utils import (
    E2M1_RAW_SCALE,
    E4M3_RAW_SCALE,
    dot_dtype,
    e2m1_to_raw_f16,
    e4m3_to_raw_f16,
    new_output,
    row_programs,
    ue8m0_to_f32,
)

_REF_CHUNK = 1 << 24  # elements of the [tokens, heads, keys] score tensor the reference holds at once
# From this many query tokens per request on average (a prefill chunk, not a decode or verify
# step) the paged call uses the tiled kernel with tiles of several tokens, which load each key
# block once per tile; decode and verify steps take fp8 keys through a tensor descriptor where that
# path was tuned (kernels/indexer_decode.py), else one-token tiles where the GPU has fp8 dots
# (decode_tiled_config), and the per-token kernel below elsewhere.
TILED_MIN_TOKENS_PER_REQUEST = 16


# ---------------------------------------------------------------- torch reference


def _scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, key_scale: torch.Tensor) -> torch.Tensor:
    """q fp32[T, H, d], w[T, H], keys fp32[N, d], key_scale[N] -> fp32[T, N] (unmasked)."""
    out = torch.empty(q.shape[0], keys.shape[0], device=q.device)
    step = max(1, _REF_CHUNK // max(1, q.shape[1] * keys.shape[0]))
    for lo in range(0, q.shape[0], step):
        s = torch.einsum("thd,nd->thn", q[lo : lo + step], keys).clamp_min_(0)
        out[lo : lo + step] = torch.einsum("thn,th->tn", s, w[lo : lo + step]) * key_scale
    return out


def indexer_logits_paged_torch(q_fp8: torch.Tensor, weights: torch.Tensor, idx_cache: torch.Tensor, key_dtype: str,
                               block_table: torch.Tensor, block_size: int, seq_ids: torch.Tensor,
                               context_lens: torch.Tensor, max_context: int) -> torch.Tensor:
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
        keys, key_scale = read_indexer_keys(gather_indexer_rows(idx_cache, slots, d_i, key_dtype), d_i, key_dtype)
        logits = _scores(q[rows], w[rows], keys, key_scale)
        visible = pos[None, :n] < context_lens[rows, None]
        out[rows, :n] = torch.where(visible, logits, float("-inf"))
    return out


def indexer_logits_ragged_torch(q_fp8: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, key_dtype: str,
                                k_start: torch.Tensor, k_end: torch.Tensor) -> torch.Tensor:
    """Reference for indexer_logits_ragged: all keys dequantised once, fp32 dots, window mask."""
    values, key_scale = read_indexer_keys(keys, q_fp8.shape[-1], key_dtype)
    logits = _scores(decode_e4m3(q_fp8), weights.float(), values, key_scale)
    col = torch.arange(keys.shape[0], device=keys.device)
    visible = (col[None, :] >= k_start[:, None]) & (col[None, :] < k_end[:, None])
    return torch.where(visible, logits, float("-inf"))


# ---------------------------------------------------------------- Triton kernel


@triton.jit
def _query_raw(q_ptr, t, offset, stride: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
               BLOCK_H: tl.constexpr, WIDTH: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Query elements offset + stride * i (i < WIDTH) of every head as raw fp16 (value / 2^8)."""
    heads = tl.arange(0, BLOCK_H)
    ptr = q_ptr + t * H * D + heads[:, None] * D + offset + stride * tl.arange(0, WIDTH)[None, :]
    return e4m3_to_raw_f16(tl.load(ptr, mask=heads[:, None] < H, other=0).to(tl.int32)).to(DOT_DTYPE)


@triton.jit
def _block_keys(blk, t, seq, start, end, block_table_ptr, block_table_stride, block_size,
                BLOCK_N: tl.constexpr, PAGED: tl.constexpr, VALUE_WORDS: tl.constexpr):
    """(columns, visible mask, the keys' value words, their scale words) of one block of keys of
    token t, as int32-word indices of the cache (key_words)."""
    cols = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    if PAGED:
        visible = cols < end
        block = tl.load(block_table_ptr + seq * block_table_stride + cols // block_size, mask=visible, other=0)
    else:  # contiguous keys: block_size is 1 and block is the column itself
        visible = (cols >= start) & (cols < end)
        block = cols // block_size
    # Invisible columns are masked, never read.
    values, scales = key_words(block.to(tl.int64), cols % block_size, block_size, VALUE_WORDS)
    return cols, visible, values, scales


@triton.jit
def _mx_group_scores(values, scales, visible, g: tl.constexpr, q_even, q_odd, DOT_DTYPE: tl.constexpr):
    """Raw scores of MXFP4 group g (32 values, bytes 16g..16g+15 of the keys' values at byte
    pointers values [BLOCK_N], one ue8m0 scale byte g of their scale words at scales) [BLOCK_N, BLOCK_H].

    Byte i holds elements 2i (low nibble) and 2i+1 (high nibble): two K=16 dots, even and odd
    elements, and the group's power-of-two scale applied to their fp32 sum.
    """
    packed = tl.load(values[:, None] + 16 * g + tl.arange(0, 16)[None, :], mask=visible[:, None], other=0)
    packed = packed.to(tl.int32)
    k_even = e2m1_to_raw_f16(packed & 0xF).to(DOT_DTYPE)
    k_odd = e2m1_to_raw_f16(packed >> 4).to(DOT_DTYPE)
    part = tl.dot(k_even, tl.trans(q_even)) + tl.dot(k_odd, tl.trans(q_odd))
    scale = ue8m0_to_f32(tl.load(scales + g, mask=visible, other=0).to(tl.int32))
    return part * scale[:, None]


@triton.jit
def _store_logits(scores, w, visible, cols, out_ptr, t, n_cols):
    logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :], axis=1)
    logits = tl.where(visible, logits, float("-inf"))
    tl.store(out_ptr + t.to(tl.int64) * n_cols + cols, logits, mask=cols < n_cols)


# block_size stays unspecialised: a multiple-of-16 hint lets the compiler load rows as 16-byte
# vectors, which rows aligned to 4 bytes only do not allow (the per-block layout's rows may, but
# that is unchecked on a GPU).
@triton.jit(do_not_specialize=["block_size"])
def _indexer_logits_kernel(
    q_ptr, w_ptr, key_ptr, key_words_ptr, out_ptr,
    block_table_ptr, seq_ids_ptr, start_ptr, end_ptr,
    n_cols, block_table_stride, block_size,
    VALUE_WORDS: tl.constexpr,  # int32 words of one key's values (d_I / 4 fp8, d_I / 8 MXFP4)
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, MXFP4: tl.constexpr, MASK_TAIL: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """Grid (tokens, programs per token): program p scores the token's key blocks p, p + P, ...

    The loop bound is read on the device (the token's end, or n_cols with MASK_TAIL), so the grid
    depends only on the shapes and a CUDA graph replays it for any context lengths; the query is
    decoded once per program, not once per block. Keys enter the dot as raw fp16 (value / 2^8
    for e4m3, / 2^14 for e2m1: exact, and the products exact in the fp32 sums); every scale is
    positive, so it multiplies the dot's fp32 result (per key, or per key and MXFP4 group)
    instead of every element, and the decode is a few integer operations per byte.
    """
    t = tl.program_id(0)
    end = tl.load(end_ptr + t)
    start = 0 if PAGED else tl.load(start_ptr + t)
    limit = n_cols if MASK_TAIL else tl.minimum(end, n_cols)
    first = 0 if MASK_TAIL else start // BLOCK_N
    heads = tl.arange(0, BLOCK_H)
    w = tl.load(w_ptr + t * H + heads, mask=heads < H, other=0.0)
    seq = tl.load(seq_ids_ptr + t).to(tl.int64) if PAGED else 0
    if MXFP4:
        # the query slices meeting each group's even and odd elements, decoded once (d_I <= 128:
        # at most four groups; smaller d_I loads its groups again, harmlessly)
        e0 = _query_raw(q_ptr, t, 0, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        o0 = _query_raw(q_ptr, t, 1, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        e1 = _query_raw(q_ptr, t, 32 % D, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        o1 = _query_raw(q_ptr, t, 32 % D + 1, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        e2 = _query_raw(q_ptr, t, 64 % D, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        o2 = _query_raw(q_ptr, t, 64 % D + 1, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        e3 = _query_raw(q_ptr, t, 96 % D, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        o3 = _query_raw(q_ptr, t, 96 % D + 1, 2, H, D, BLOCK_H, 16, DOT_DTYPE)
        for blk in range(first + tl.program_id(1), tl.cdiv(limit, BLOCK_N), tl.num_programs(1)):
            cols, visible, value_words, scale_words = _block_keys(
                blk, t, seq, start, end, block_table_ptr, block_table_stride, block_size, BLOCK_N, PAGED, VALUE_WORDS)
            values, scales = key_ptr + 4 * value_words, key_ptr + 4 * scale_words  # [BLOCK_N] byte pointers
            scores = _mx_group_scores(values, scales, visible, 0, e0, o0, DOT_DTYPE)
            if D >= 64:
                scores += _mx_group_scores(values, scales, visible, 1, e1, o1, DOT_DTYPE)
            if D >= 128:
                scores += _mx_group_scores(values, scales, visible, 2, e2, o2, DOT_DTYPE)
                scores += _mx_group_scores(values, scales, visible, 3, e3, o3, DOT_DTYPE)
            _store_logits(scores * (E2M1_RAW_SCALE * E4M3_RAW_SCALE), w, visible, cols, out_ptr, t, n_cols)
    else:
        q = _query_raw(q_ptr, t, 0, 1, H, D, BLOCK_H, D, DOT_DTYPE)
        dims = tl.arange(0, D)
        for blk in range(first + tl.program_id(1), tl.cdiv(limit, BLOCK_N), tl.num_programs(1)):
            cols, visible, value_words, scale_words = _block_keys(
                blk, t, seq, start, end, block_table_ptr, block_table_stride, block_size, BLOCK_N, PAGED, VALUE_WORDS)
            raw = e4m3_to_raw_f16(tl.load(key_ptr + 4 * value_words[:, None] + dims[None, :],
                                          mask=visible[:, None], other=0).to(tl.int32))
            scale_bits = tl.load(key_words_ptr + scale_words, mask=visible, other=0)
            key_scale = scale_bits.to(tl.float32, bitcast=True) * (E4M3_RAW_SCALE * E4M3_RAW_SCALE)
            scores = tl.dot(raw.to(DOT_DTYPE), tl.trans(q)) * key_scale[:, None]
            _store_logits(scores, w, visible, cols, out_ptr, t, n_cols)


@dataclass(frozen=True)
class IndexerConfig:
    """Keys per block, warps, programs per multiprocessor (the grid) and software-pipelining
    depth of the indexer kernel (None: Triton's default)."""

    block_n: int
    num_warps: int
    programs_per_sm: int = 8
    num_stages: int | None = None


def default_config(key_dtype: str, device: torch.device) -> IndexerConfig:
    """The fastest config at 64 and 16 requests x 64k keys (benchmarks/kernels.py --only indexer;
    benchmarks/kernels_notes.md)."""
    if device.type != "cuda":
        return IndexerConfig(16, 4)
    return IndexerConfig(64, 4, 8, 1) if key_dtype == "fp8" else IndexerConfig(64, 4, 8)


def indexer_logits_triton(q_fp8: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, key_dtype: str,
                          block_table: torch.Tensor, seq_ids: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                          block_size: int, n_cols: int, paged: bool, config: IndexerConfig | None = None,
                          mask_tail: bool = True) -> torch.Tensor:
    """Launch the kernel on prepared (contiguous, int32) inputs; config overrides the tile shape.
    mask_tail=False leaves the columns at or past each token's end unwritten."""
    t, h, d = q_fp8.shape
    out = new_output((t, n_cols), torch.float32, q_fp8.device)
    if t == 0 or n_cols == 0:
        return out
    cfg = config or default_config(key_dtype, q_fp8.device)
    grid = (t, row_programs(t, triton.cdiv(n_cols, cfg.block_n), q_fp8.device, cfg.programs_per_sm))
    _indexer_logits_kernel[grid](
        q_fp8, weights, rows, rows.view(torch.int32), out,
        block_table, seq_ids, start, end,
        n_cols, block_table.stride(0), block_size,
        VALUE_WORDS=indexer_value_bytes(d, key_dtype) // 4, H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)),
        BLOCK_N=cfg.block_n,
        PAGED=paged, MXFP4=key_dtype == "mxfp4", MASK_TAIL=mask_tail, DOT_DTYPE=dot_dtype(q_fp8, tl.float16),
        num_warps=cfg.num_warps, **({} if cfg.num_stages is None else {"num_stages": cfg.num_stages}),
    )
    return out


# ---------------------------------------------------------------- public API


def _check_inputs(q_fp8: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, key_dtype: str, block_size: int,
                  name: str) -> None:
    if q_fp8.dtype != torch.uint8 or q_fp8.dim() != 3:
        raise ValueError(f"{name}: q_fp8 must be uint8[T, H_I, d_I], got {q_fp8.dtype}{list(q_fp8.shape)}")
    t, h, d = q_fp8.shape
    if d < 16 or d & (d - 1):
        raise ValueError(f"{name}: d_I={d} must be a power of two >= 16")
    if weights.shape != (t, h):
        raise ValueError(f"{name}: weights must be [T, H_I] = {[t, h]}, got {list(weights.shape)}")
    if key_dtype == "mxfp4" and d > 128:
        raise ValueError(f"{name}: d_I={d}: the MXFP4 kernel holds at most four 32-value groups (d_I <= 128)")
    width = block_size * indexer_row_bytes(d, key_dtype)
    if keys.dtype != torch.uint8 or keys.dim() != 2 or keys.shape[1] != width:
        what = "key rows must be uint8[N" if block_size == 1 else "the key cache must be uint8[num_blocks"
        raise ValueError(f"{name}: {what}, {width}] for d_I={d} {key_dtype} (block_size {block_size}), "
                         f"got {keys.dtype}{list(keys.shape)}")


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
    mask_tail: bool = True,
) -> torch.Tensor:
    """fp32[T, max_context] logits of each query token over its request's paged keys (-inf past context_lens[t]).

    mask_tail=False: the Triton kernel leaves the columns at or past context_lens[t] unwritten
    and spends no work on them (the engine's top-k reads only a row's first context_lens[t]
    columns, and a captured CUDA graph sizes max_context for the longest context it may see)."""
    _check_inputs(q_fp8, weights, idx_cache, key_dtype, block_size, "indexer_logits_paged")
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
    q_fp8, weights, idx_cache = q_fp8.contiguous(), weights.float().contiguous(), idx_cache.contiguous()
    block_table, seq_ids = block_table.int().contiguous(), seq_ids.int().contiguous()
    ends = context_lens.int().contiguous()
    if t >= TILED_MIN_TOKENS_PER_REQUEST * block_table.shape[0]:
        return indexer_logits_tiled(q_fp8, weights, idx_cache, key_dtype, block_table, seq_ids, ends, block_size,
                                    max_context, mask_tail=mask_tail)
    descriptor = descriptor_decode_config(key_dtype, q_fp8.shape[1], q_fp8.shape[2], block_size, q_fp8.device)
    if descriptor is not None:
        return indexer_decode_descriptor(q_fp8, weights, idx_cache, block_table, seq_ids, ends, block_size,
                                         max_context, descriptor, mask_tail)
    decode = decode_tiled_config(key_dtype, q_fp8.shape[1], q_fp8.device)
    if decode is not None:
        return indexer_logits_tiled(q_fp8, weights, idx_cache, key_dtype, block_table, seq_ids, ends, block_size,
                                    max_context, decode, mask_tail)
    return indexer_logits_triton(q_fp8, weights, idx_cache, key_dtype, block_table, seq_ids, ends, ends, block_size,
                                 max_context, paged=True, mask_tail=mask_tail)


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
    _check_inputs(q_fp8, weights, keys, key_dtype, 1, "indexer_logits_ragged")
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
