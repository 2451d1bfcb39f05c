"""The one-launch top-k: one program per row reads the row once into registers (up to
REGISTER_ROW_MAX_COLS columns; the register block halved when the row's length fits half of it,
which halves the work of every count) and finds the k-th largest key by narrowing a key interval.
Each step of that search is one block reduction of a compare per key, its pivot interpolated from
the counts: about 8 steps after the row's max and min for continuous values (it stops once exactly
k keys lie at or above the interval's low end), about 32 for ties. The kernel is bound by that
chain of reductions, not by memory, hence one reduction a step. With a block table it writes the
selected columns' cache slots itself, so a decode step's top-k is one launch.

The search (`search_kth_key`) also finds the sampled path's threshold and its finish's k-th key."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.topk.rows import row_of_program, store_short_row_slots
from kernels.topk.slots import SlotMap, request_table_row, slot_args, slots_of
from kernels.triton_utils import ordered_key

# The in-register kernel's emit packs two counts of a block into one int32 (above the k-th largest
# key in the high half, kept below 2^15 by this bound, candidates in the low): the longest row it
# takes, and so the most TopkConfig.single_pass_max_cols may be.
REGISTER_ROW_MAX_COLS = 16384


@triton.jit
def _count_at_or_above(key, pivot):
    return tl.sum((key >= pivot).to(tl.int32), axis=0)


# Steps past bisection's 32 that the interpolation search may take on rows it guesses badly:
# each step's pivot is kept close enough to the interval's middle that after step j (from 0) the
# interval is about 2^(31 + SEARCH_SLACK - j) keys wide at most, whatever the row. At 0, rows whose
# k-th largest value ties (ReLU'd logits with k half the row) take bisection's ~32 steps, not more.
SEARCH_SLACK = 0
FIRST_REACH = tl.constexpr(2.0 ** (31 + SEARCH_SLACK))
LARGEST_F32_BELOW_2_32 = tl.constexpr(4294967040.0)


@triton.jit
def _interpolation_step(key, k, lo, top, c_lo, c_hi, w_lo, w_hi, kept, reach):
    """One step of the search for the k-th largest key: [lo, top] holds it, with c_lo > k keys at
    or above lo and c_hi < k above top; counts the keys at or above a pivot in (lo, top] and keeps
    the part that holds it.

    The pivot is where a straight line through (lo, w_lo) and (top, w_hi) crosses zero, w being
    the count less k (regula falsi on the count over the key space, smooth where values are:
    the keys of floats are spaced like their logarithms), with Illinois: an end kept twice in a
    row has its weight halved, so that a one-sided approach speeds up. The pivot stays within
    `reach` (halved each step) less half the interval of its middle (an ITP-style projection),
    which bounds the steps of a row the line guesses badly (ties, gaps, outliers) near
    32 + SEARCH_SLACK. `kept`: 1 if the last step kept the upper part, -1 the lower, 0 at first.
    The pivot's arithmetic is fp32 and 32-bit: each step waits on it, and 64-bit integer
    arithmetic lengthens every step; only the clamp to (lo, top] is exact. One pivot per block
    reduction: two or three (thirds with both counts packed in one int32, or quarters by one
    three-value reduction) save steps, but their extra compares cost as much as the steps saved.
    """
    span = top - lo
    span_f = span.to(tl.float32)
    guess = span_f * (w_lo / (w_lo - w_hi))
    # within reach - span/2 of the middle span/2, then inside (lo, top] whatever reach is left
    off = tl.minimum(tl.maximum(tl.minimum(tl.maximum(guess, span_f - reach), reach), 1.0), span_f)
    # span_f rounds up to 2^32 for spans within 128 of it (a row holding NaNs of both signs): the
    # cast to uint32 must stay in range, where out-of-range casts are undefined (LLVM's fptoui)
    off = tl.minimum(off, LARGEST_F32_BELOW_2_32)
    pivot = lo + tl.minimum(off.to(tl.uint32), span)
    c = _count_at_or_above(key, pivot)
    up = c >= k
    w = (c - k).to(tl.float32)
    w_lo = tl.where(~up & (kept < 0), w_lo * 0.5, w_lo)
    w_hi = tl.where(up & (kept > 0), w_hi * 0.5, w_hi)
    return (tl.where(up, pivot, lo), tl.where(up, top, pivot - 1), tl.where(up, c, c_lo), tl.where(up, c_hi, c),
            tl.where(up, w, w_lo), tl.where(up, w_hi, w), tl.where(up, 1, -1), reach * 0.5)


@triton.jit
def search_kth_key(key, valid, length, k):
    """(lo, top, c_hi): the k-th largest key lies in [lo, top], c_hi < k keys lie above top and
    every key in [lo, top] belongs to the top k: exactly k keys lie at or above lo, or lo == top.

    Two reductions bound the interval by the row's largest and smallest keys (a row of one value
    ends there; the tight interval saves more steps than the second reduction costs, and two plain
    reductions cost less than one reduction of pairs), then interpolation steps
    (_interpolation_step). Once k - 1 keys lie above top, the k-th largest is the largest key at
    or below top: one max reduction finds it and ends the search, where landing exactly on k by
    counts would take several steps.
    """
    top = tl.max(tl.where(valid, key, 0), axis=0)
    lo = tl.min(tl.where(valid, key, tl.full(key.shape, 0xFFFFFFFF, tl.uint32)), axis=0)
    c_lo = length
    c_hi = tl.full((), 0, tl.int32)
    w_lo = (c_lo - k).to(tl.float32)
    w_hi = (c_hi - k).to(tl.float32)
    kept = tl.full((), 0, tl.int32)
    reach = tl.full((), FIRST_REACH, tl.float32)
    while (c_lo > k) & (top > lo):
        if c_hi == k - 1:
            lo = tl.max(tl.where(key <= top, key, 0), axis=0)
            top = lo
        else:
            lo, top, c_lo, c_hi, w_lo, w_hi, kept, reach = _interpolation_step(
                key, k, lo, top, c_lo, c_hi, w_lo, w_hi, kept, reach)
    return lo, top, c_hi


@triton.jit
def _select_in_registers(row_ptr, out_row, length, k, table_row, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Top k of a row of length in (k, BLOCK] columns whose keys stay in registers; with TO_SLOTS
    it writes their cache slots (`slots_of`), looked up for every column before the search, whose
    loads then overlap the search rather than follow it.

    The k-th largest key is found by narrowing a key interval [lo, top] (search_kth_key), each
    count of the keys at or above a pivot one block reduction (no histogram), until exactly k keys
    lie at or above lo (the k largest, whatever ties lie below) or the interval is one key (lo is
    the k-th largest). Then one emit: the keys above top, then keys in [lo, top] while fewer than
    k are placed, positions from one packed scan.
    """
    col = tl.arange(0, BLOCK)
    valid = col < length
    # columns past the length get key 0 and never count: every pivot is above 0
    key = tl.where(valid, ordered_key(tl.load(row_ptr + col, mask=valid, other=0.0)), 0)
    dest = slots_of(col, valid, table_row, BLOCK_SIZE, TO_SLOTS)
    lo, top, c_hi = search_kth_key(key, valid, length, k)
    is_above = key > top
    is_cand = valid & (key >= lo) & (key <= top)
    rank = tl.cumsum((is_above.to(tl.int32) << 16) | is_cand.to(tl.int32), axis=0)
    pos = tl.where(is_above, (rank >> 16) - 1, c_hi + (rank & 0xFFFF) - 1)
    tl.store(out_row + pos, dest, mask=is_above | (is_cand & (pos < k)))


@triton.jit
def _topk_in_registers_kernel(logits_ptr, lengths_ptr, out_ptr, n_cols, k, table_ptr, seq_ids_ptr, table_stride,
                              BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr, BLOCK: tl.constexpr):
    """The whole top-k of one row in one program (grid: rows) that reads the row once, into
    registers: BLOCK >= n_cols columns, or half as many when the row's length (read on the device)
    fits them, which halves the work of every count. With TO_SLOTS it writes the selected columns'
    cache slots: block table[seq_ids[row]] (rows of table_stride) in blocks of BLOCK_SIZE."""
    length, row_ptr, out_row = row_of_program(logits_ptr, lengths_ptr, out_ptr, n_cols, k)
    table_row = request_table_row(table_ptr, seq_ids_ptr, table_stride, TO_SLOTS)
    if length <= k:
        store_short_row_slots(out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)
    elif length <= BLOCK // 2:
        _select_in_registers(row_ptr, out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK // 2)
    else:
        _select_in_registers(row_ptr, out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)


def topk_in_registers(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int, num_warps: int,
                      slots: SlotMap | None) -> torch.Tensor:
    """The one-launch kernel over rows of at most REGISTER_ROW_MAX_COLS columns, writing positions
    or, with `slots`, cache slots to out."""
    t, n = logits.shape
    table, seq_ids, block_size = slot_args(slots, out, lengths)
    _topk_in_registers_kernel[(t,)](logits, lengths, out, n, k, table, seq_ids, table.stride(0),
                                    BLOCK_SIZE=block_size, TO_SLOTS=slots is not None,
                                    BLOCK=max(64, triton.next_power_of_2(n)), num_warps=num_warps)
    return out
