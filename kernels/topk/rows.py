"""Device helpers the top-k paths share: a program's row, its keys a block at a time, the output
of a row no longer than k, the per-row counter table's stride, and a portable popcount."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.topk.slots import slots_of
from kernels.triton_utils import ordered_key

# Ints per row of the counter table: a row's counters get a 128-byte line of their own, so rows
# counting at once do not share one.
COUNTER_STRIDE = tl.constexpr(32)


@triton.jit
def load_keys(row_ptr, start, hi, BLOCK: tl.constexpr):
    """Columns start..start+BLOCK, their ordered keys and which of them lie below hi."""
    col = start + tl.arange(0, BLOCK)
    valid = col < hi
    return col, ordered_key(tl.load(row_ptr + col, mask=valid, other=0.0)), valid


@triton.jit
def row_of_program(logits_ptr, lengths_ptr, out_ptr, n_cols, k):
    """(the length clamped to the row, the row's logits, its output) of the row of program_id(0)."""
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    return length, logits_ptr + row.to(tl.int64) * n_cols, out_ptr + row.to(tl.int64) * k


@triton.jit
def store_short_row_slots(out_row, length, k, table_row, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr,
                          BLOCK: tl.constexpr):
    """A row no longer than k: positions (or with TO_SLOTS their slots) 0..len-1, then -1."""
    for start in range(0, k, BLOCK):
        slot = start + tl.arange(0, BLOCK)
        inside = slot < length
        dest = slots_of(slot, inside, table_row, BLOCK_SIZE, TO_SLOTS)
        tl.store(out_row + slot, tl.where(inside, dest, -1), mask=slot < k)


@triton.jit
def store_short_row(out_row, length, k, BLOCK: tl.constexpr):
    """A row no longer than k: 0..len-1 then -1."""
    store_short_row_slots(out_row, length, k, out_row, 1, False, BLOCK)


@triton.jit
def popcount(words):
    """Set bits of each int32 word (SWAR on uint32: no popcount intrinsic, which is not portable)."""
    x = words.to(tl.uint32, bitcast=True)
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)
