"""Exact per-row top-k column indices with per-row lengths, and their mapping to cache slots.

Triton path: one program per row runs a radix select on order-preserving 32-bit keys (four
passes of 8-bit digit histograms narrow the k-th largest key down to one value), then one emit
pass writes every column above that threshold plus just enough columns equal to it. Rows no
longer than k skip the select and emit 0..len-1 then -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.triton_utils import new_output


# ---------------------------------------------------------------- torch reference


def topk_indices_torch(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """Reference: torch.topk over each row's first lengths[t] columns, short rows 0..len-1 then -1."""
    t, n = logits.shape
    lengths = lengths.long()
    out = torch.full((t, k), -1, dtype=torch.int32, device=logits.device)
    col = torch.arange(n, device=logits.device)
    masked = torch.where(col[None, :] < lengths[:, None], logits.float(), float("-inf"))
    if n:
        _, idx = masked.topk(min(k, n), dim=1)
        out[:, : idx.shape[1]] = idx.int()
    short = lengths <= k
    slot = torch.arange(k, device=logits.device)
    ramp = torch.where(slot[None, :] < lengths[:, None], slot[None, :], -1).int()
    return torch.where(short[:, None], ramp, out)


# ---------------------------------------------------------------- Triton kernel


@triton.jit
def _ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (NaN above +inf)."""
    bits = x.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) != 0, tl.full(bits.shape, 0xFFFFFFFF, tl.uint32), tl.full(bits.shape, 0x80000000, tl.uint32))
    return bits ^ flip


@triton.jit
def _topk_kernel(logits_ptr, lengths_ptr, out_ptr, n_cols, k, BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    row_ptr = logits_ptr + row.to(tl.int64) * n_cols
    out_row = out_ptr + row.to(tl.int64) * k
    if length <= k:
        for start in range(0, k, OUT_BLOCK):
            slot = start + tl.arange(0, OUT_BLOCK)
            tl.store(out_row + slot, tl.where(slot < length, slot, -1), mask=slot < k)
    else:
        bins = tl.arange(0, 256)
        first_half = tl.arange(0, 2)[:, None] == 0
        prefix = tl.full((), 0, tl.uint32)
        prefix_mask = tl.full((), 0, tl.uint32)
        remaining = k  # how many of the columns matching the prefix still belong to the top k
        for level in tl.static_range(4):
            hist = tl.zeros((256,), tl.int32)
            for start in range(0, length, BLOCK):
                col = start + tl.arange(0, BLOCK)
                key = _ordered_key(tl.load(row_ptr + col, mask=col < length, other=0.0))
                match = (col < length) & ((key & prefix_mask) == prefix)
                # columns off the prefix go to bin 256, in the half of the histogram that is dropped
                digit = tl.where(match, ((key >> (24 - 8 * level)) & 0xFF).to(tl.int32), 256)
                hist += tl.sum(tl.where(first_half, tl.reshape(tl.histogram(digit, 512), (2, 256)), 0), axis=0)
            # at_or_above[b]: matching columns whose digit is >= b; the k-th largest has the
            # highest digit whose at_or_above still reaches `remaining`
            at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
            digit_star = tl.max(tl.where(at_or_above >= remaining, bins, -1), axis=0)
            remaining -= tl.sum(tl.where(bins > digit_star, hist, 0), axis=0)
            prefix = prefix | (digit_star.to(tl.uint32) << (24 - 8 * level))
            prefix_mask = prefix_mask | (tl.full((), 0xFF, tl.uint32) << (24 - 8 * level))
        # prefix is now the k-th largest key: emit all keys above it, then `remaining` equal ones
        n_above = k - remaining
        written_above = 0
        written_equal = 0
        for start in range(0, length, BLOCK):
            col = start + tl.arange(0, BLOCK)
            key = _ordered_key(tl.load(row_ptr + col, mask=col < length, other=0.0))
            valid = col < length
            is_above = valid & (key > prefix)
            is_equal = valid & (key == prefix)
            pos_above = written_above + tl.cumsum(is_above.to(tl.int32), axis=0) - 1
            pos_equal = written_equal + tl.cumsum(is_equal.to(tl.int32), axis=0) - 1
            tl.store(out_row + pos_above, col, mask=is_above)
            tl.store(out_row + n_above + pos_equal, col, mask=is_equal & (pos_equal < remaining))
            written_above += tl.sum(is_above.to(tl.int32), axis=0)
            written_equal += tl.sum(is_equal.to(tl.int32), axis=0)


@dataclass(frozen=True)
class TopkConfig:
    """Columns per loop step and warps of the radix-select kernel."""

    block: int
    num_warps: int


def default_config(device: torch.device) -> TopkConfig:
    return TopkConfig(4096, 8) if device.type == "cuda" else TopkConfig(64, 4)


def topk_triton(logits: torch.Tensor, lengths: torch.Tensor, k: int, config: TopkConfig | None = None) -> torch.Tensor:
    """Launch the radix-select kernel, one program per row."""
    t, n = logits.shape
    out = new_output((t, k), torch.int32, logits.device)
    if t == 0:
        return out
    cfg = config or default_config(logits.device)
    _topk_kernel[(t,)](logits, lengths, out, n, k, BLOCK=cfg.block, OUT_BLOCK=min(cfg.block, 1024), num_warps=cfg.num_warps)
    return out


# ---------------------------------------------------------------- public API


def topk_indices(logits: torch.Tensor, lengths: torch.Tensor, k: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: exact top-k column indices among each row's first lengths[t] columns, any order.

    Rows with lengths[t] <= k emit 0..len-1 then -1.
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"topk_indices: logits must be fp32[T, N], got {logits.dtype}{list(logits.shape)}")
    if lengths.shape != (logits.shape[0],):
        raise ValueError(f"topk_indices: lengths must be [T={logits.shape[0]}], got {list(lengths.shape)}")
    if k <= 0:
        raise ValueError(f"topk_indices: k={k} must be positive")
    if resolve_backend(backend, logits.device) == "torch":
        return topk_indices_torch(logits, lengths, k)
    return topk_triton(logits.contiguous(), lengths.int().contiguous(), k)


def positions_to_slots(idx: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Map positions idx[T, k] of request seq_ids[t] to global slots through the block table; -1 stays -1."""
    if idx.dim() != 2 or seq_ids.shape != (idx.shape[0],):
        raise ValueError(f"positions_to_slots: idx [T, k] and seq_ids [T] expected, got {list(idx.shape)}, {list(seq_ids.shape)}")
    valid = idx >= 0
    pos = torch.where(valid, idx, 0).long()
    if idx.numel() and int(pos.max()) >= block_table.shape[1] * block_size:
        raise ValueError("positions_to_slots: a position lies beyond the block table")
    blocks = block_table.long()[seq_ids.long()[:, None], pos // block_size]
    return torch.where(valid, blocks * block_size + pos % block_size, -1).int()
