"""Radix select on order-preserving 32-bit keys, as device helpers: four levels of 8-bit digit
histograms, each over the keys that match the digits chosen so far, fix the k-th largest key digit
by digit; an emit then writes the keys above it and just enough of those equal to it. The
compacting path runs its first levels as full-row passes and the rest in one program over its
candidates (or the row); the sampled path's fallback runs all four in one program over the row."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.topk.rows import load_keys

RADIX_LEVELS = tl.constexpr(4)  # 8-bit digits of a 32-bit key, most significant first


@triton.jit
def digit_shift(level):
    """Right shift of level's digit; level may be a plain int (interpreter) or a tensor."""
    return (tl.zeros((), tl.int32) + 24 - 8 * level).to(tl.uint32)


@triton.jit
def digit_histogram(key, match, shift):
    """256-bin histogram of the digit at `shift` over the keys where match holds."""
    # A masked histogram, not a 512-bin one with the other keys in a dropped half: on NVIDIA the
    # histogram is a ballot per bin-index bit plus, per lane, a popcount for each bin it owns, so
    # its cost grows with the bin count (16 bins a lane at 512, 8 at 256 plus one mask ballot).
    return tl.histogram(((key >> shift) & 0xFF).to(tl.int32), 256, mask=match)


@triton.jit
def narrow_prefix(hist, level, prefix, prefix_mask, remaining):
    """Fix level's digit of the k-th largest key from that level's histogram of matching keys.

    (prefix, prefix_mask, remaining) are the top digits of the k-th largest key, which bits they
    cover, and how many of the keys matching them still belong to the top k; returns them updated.
    """
    bins = tl.arange(0, 256)
    # at_or_above[b]: matching keys whose digit is >= b; the k-th largest has the highest
    # digit whose at_or_above still reaches `remaining`
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    digit = tl.max(tl.where(at_or_above >= remaining, bins, -1), axis=0)
    remaining -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    shift = digit_shift(level)
    prefix = prefix | (digit.to(tl.uint32) << shift)
    prefix_mask = prefix_mask | (tl.full((), 0xFF, tl.uint32) << shift)
    return prefix, prefix_mask, remaining


@triton.jit
def _store_selected(out_row, col, is_above, is_equal, above_before, equal_before, n_above, remaining):
    """Write the block's columns above the k-th largest key after the above_before ones already
    placed, and its columns equal to it after n_above + equal_before while fewer than remaining."""
    pos_above = above_before + tl.cumsum(is_above.to(tl.int32), axis=0) - 1
    pos_equal = equal_before + tl.cumsum(is_equal.to(tl.int32), axis=0) - 1
    tl.store(out_row + pos_above, col, mask=is_above)
    tl.store(out_row + n_above + pos_equal, col, mask=is_equal & (pos_equal < remaining))


@triton.jit
def _load_entries(keys_ptr, cols_ptr, start, hi, FROM_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Entries start..start+BLOCK below hi: of a row (column = position, key from the logits), or of
    a candidate list (stored ordered keys and columns). Returns columns, keys, validity."""
    if FROM_ROW:
        return load_keys(keys_ptr, start, hi, BLOCK)
    else:
        i = start + tl.arange(0, BLOCK)
        valid = i < hi
        key = tl.load(keys_ptr + i, mask=valid, other=0).to(tl.uint32, bitcast=True)
        return tl.load(cols_ptr + i, mask=valid, other=0), key, valid


@triton.jit
def _tie_cut(keys_ptr, cols_ptr, n, kth, wanted, BLOCK: tl.constexpr):
    """The column c such that exactly `wanted` entries of a candidate list with key kth lie at
    columns <= c (columns are distinct): a bisection over the column range, a pass over the list
    per step. Only rows with more entries equal to the k-th largest key than the top k holds
    (ties at the boundary, rare in continuous logits) take it."""
    lo = tl.full((), 0, tl.int32)
    hi = tl.full((), 0x7FFFFFFF, tl.int32)
    while lo < hi:
        mid = lo + (hi - lo) // 2
        count = tl.full((), 0, tl.int32)
        for start in range(0, n, BLOCK):
            col, key, valid = _load_entries(keys_ptr, cols_ptr, start, n, False, BLOCK)
            count += tl.sum((valid & (key == kth) & (col <= mid)).to(tl.int32), axis=0)
        if count >= wanted:
            hi = mid
        else:
            lo = mid + 1
    return lo


@triton.jit
def radix_levels(keys_ptr, cols_ptr, n, prefix, prefix_mask, remaining, first_level, FROM_ROW: tl.constexpr,
                 BLOCK: tl.constexpr):
    """The radix select's levels from first_level on in one program over n entries (`_load_entries`)
    whose keys match (prefix, prefix_mask), each level re-reading them with its histogram in
    registers. Returns the k-th largest key, how many entries equal to it belong to the top k,
    and how many entries equal it."""
    n_equal = tl.full((), 0, tl.int32)
    for level in range(first_level, RADIX_LEVELS):
        shift = digit_shift(level)
        hist = tl.zeros((256,), tl.int32)
        for start in range(0, n, BLOCK):
            col, key, valid = _load_entries(keys_ptr, cols_ptr, start, n, FROM_ROW, BLOCK)
            hist += digit_histogram(key, valid & ((key & prefix_mask) == prefix), shift)
        prefix, prefix_mask, remaining = narrow_prefix(hist, level, prefix, prefix_mask, remaining)
        # entries matching the prefix so far with its new digit: after the last level, those equal
        # to the k-th largest key
        n_equal = tl.sum(tl.where(tl.arange(0, 256) == ((prefix >> shift) & 0xFF).to(tl.int32), hist, 0), axis=0)
    return prefix, remaining, n_equal


@triton.jit
def select_in_program(keys_ptr, cols_ptr, n, out_row, k, prefix, prefix_mask, remaining, first_level,
                      FROM_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """The radix select's levels from first_level on, and its emit, in one program over n entries.

    Only entries whose key matches (prefix, prefix_mask), the digits fixed by earlier levels, take
    part; the k - remaining outputs above them are already placed. Each level re-reads the entries
    and keeps its histogram in registers; the emit carries how many entries above and equal to the
    k-th largest key it has written, in place of atomic counters. Of the entries equal to the k-th
    largest key it takes those of the lowest columns: the first ones of a row (FROM_ROW), or of a
    candidate list (whose order is the order its entries arrived in) those below a cut found by
    `_tie_cut`, so the choice does not depend on that order.
    """
    start_prefix, start_mask, placed = prefix, prefix_mask, k - remaining
    prefix, remaining, n_equal = radix_levels(keys_ptr, cols_ptr, n, prefix, prefix_mask, remaining, first_level,
                                              FROM_ROW, BLOCK)
    n_above = k - remaining - placed  # prefix is now the k-th largest key
    cut = tl.full((), 0x7FFFFFFF, tl.int32)  # the highest column an equal entry may have
    if not FROM_ROW:
        if n_equal > remaining:
            cut = _tie_cut(keys_ptr, cols_ptr, n, prefix, remaining, BLOCK)
    above_before = tl.full((), 0, tl.int32)
    equal_before = tl.full((), 0, tl.int32)
    for start in range(0, n, BLOCK):
        col, key, valid = _load_entries(keys_ptr, cols_ptr, start, n, FROM_ROW, BLOCK)
        valid = valid & ((key & start_mask) == start_prefix)
        is_above = valid & (key > prefix)
        is_equal = valid & (key == prefix) & (col <= cut)
        _store_selected(out_row + placed, col, is_above, is_equal, above_before, equal_before, n_above, remaining)
        above_before += tl.sum(is_above.to(tl.int32), axis=0)
        equal_before += tl.sum(is_equal.to(tl.int32), axis=0)
