"""Exact per-row top-k column indices with per-row lengths, and their mapping to cache slots.

Triton path: a selection on order-preserving 32-bit keys. The k-th largest key is found either by
a radix select, levels of 8-bit digit histograms (keys matching the digits chosen so far), or,
for rows held in registers, by narrowing a key interval with counts of the keys at or above a
pivot; an emit pass then writes every column above it plus just enough columns equal to it.
Rows no longer than k emit 0..len-1 then -1. `topk_slots` emits the selected columns' cache slots
(a block-table lookup per column, in the in-register kernel's own write), what sparse attention reads.

Launch shapes, chosen by the row and column counts and the config alone (so a CUDA graph keeps a fixed
choice; a row's length and values only steer branches on the device):
- up to `TopkConfig.single_pass_max_cols` columns, ONE launch with one program per row, no scratch
  table, atomics or further launches (at decode shapes a launch costs more than the work):
  - the row is read once into registers (up to REGISTER_ROW_MAX_COLS columns, the
    register block halved when the row's length fits half of it), and each step of the interval
    search is one block reduction of a compare per key, its pivot interpolated from the counts:
    about 8 steps after the row's max and min for continuous values (it stops once exactly k keys
    lie at or above the interval's low end), about 32 for ties. Bound by that chain of
    reductions: 6.8 us for one 4k row in a CUDA graph on an H200 (benchmarks/RESULTS.md, top-k:
    fewer search steps);
- longer rows, spread over (rows x programs, each looping over chunks of columns up to the row's
  length) so that a few long rows still fill the GPU; either
  - the sampled path (`TopkConfig.sample` > 0, `default_config`'s choice for batches of more than
    SAMPLED_MIN_COLUMNS columns in all), three launches and one full-row pass: one program per
    row draws a sample of up to SAMPLE_COLS columns and takes as threshold the key of a rank in
    it that, by a binomial margin, at least k of the row's columns reach; a mark pass writes the
    bitmap of the columns that reach it (a word per 32 columns, each by one program: no atomics
    but one count per program); one program per row then lists the marked columns in ascending
    order from the bitmap, gathers their keys into registers, finds the k-th largest with the
    in-register search and writes the top k in column order (ties by lowest column). Exact and
    run-to-run identical by construction; a row with fewer than k or more than
    `TopkConfig.candidates` marked columns (a sample far off its row: about once in 10^9 rows
    of continuous values; rows of many equal values) finishes over the row itself, slower. At
    64 x 65,536, k 2,048 on an H200: 31.6 us against the compacting path's 77.0 and torch.topk's
    143.6 (benchmarks/RESULTS.md, top-k from a sample); or
  - the histograms meeting in a per-row table in global memory and outputs placed by atomic
    counters, the compacting path (`TopkConfig.candidates` > 0 and no sample, `default_config`'s
    choice for smaller batches), four launches: two histogram levels fix the top 16 bits of the
    k-th largest key; a split pass writes the columns above that prefix to the output and those in
    its bin (the candidates, a small share of a row) to a per-row list; then one program per row
    finishes the last two levels and the emit on its list alone, then puts the row in ascending
    column order: the split's atomics place columns in an order that varies from run to run, and
    the sparse attention's sums follow the order it is given, so without it two runs of one step
    differed in their last bits (ties at the k-th value go to the lowest columns, as in the
    one-launch kernel). A row whose candidates overflow the list (values crowding into one
    prefix, or many ties) finishes over the row itself: exact, slower.
Each histogram pass is bound by instruction issue, not memory (benchmarks/RESULTS.md, compacting
top-k): so the compacting path's gain is the passes it leaves out, and the histogram levels step
more columns at a time than the split (`TopkConfig.hist_block`), which spreads a histogram's
per-step cost over more columns; the sampled path's one pass is a compare and a word per 32
columns (0.65 warp instructions a column in the SASS of Triton 3.9, which gives a histogram level
at 2,048-column steps 3.1: `benchmarks/topk_sass.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend, values_checkable
from kernels.triton_utils import new_output, ordered_key, row_programs

# Rows up to this many columns take the single launch with the row in registers, one program per
# row, which beats the multi-launch paths until a row is long enough for the (rows x programs)
# spread to pay: in a CUDA graph on an H200 (benchmarks/RESULTS.md, top-k with the row in
# registers; benchmarks/kernels.py --only topk times every path) 8.0 vs 16.7 us (compacting) and
# 22.1 (one-launch radix) at 1 x 4150 columns of length 4096, k=512 (the small model's decode rows),
# 10.7 vs 22.7 and 22.4 at 128 such rows, 11.6 vs 16.2 at 1 x 8192, k=2048, but 17.0 vs 16.5 at
# 1 x 16,384, all with the kernel's earlier bisection search (the interpolation search since: 6.8,
# 8.0 and 8.9 us at the first three; top-k: fewer search steps).
SINGLE_PASS_MAX_COLS = 8192
# Warps of that program: 8 beat 4 and 16 at every shape up to 8192 columns but 128 x 4096 with k=2048
# (12.2 vs 11.6 at 4 warps).
SINGLE_PASS_WARPS = 8
# Longer rows take the sampled path when the batch holds more than this many columns in all (rows
# x columns), else the compacting path. The sampled path's three launches each wait on a chain of
# block-wide reductions in one program per row (~20 us in all for one row), so it wins once the
# compacting path's full-row passes take longer: on an H200 (benchmarks/RESULTS.md, top-k from a
# sample), positions replayed in a CUDA graph, compacting vs sampled, 18.2 vs 20.4 us at 1 x 16,384
# and 17.7 vs 19.5 at 1 x 32,768 (length 4,096), k 512; 18.7 vs 19.1 at 8 x 8,320 (as cache
# slots, what the engine asks for, 20.0 vs 19.1); 33.2 vs 25.8 at 16 x 65,536 and 77.0 vs 31.6 at
# 64 x 65,536, k 2,048.
SAMPLED_MIN_COLUMNS = 1 << 16
# The compacting path takes rows up to this many columns with 1,024-column chunks at 16
# programs/SM, longer rows with 2,048-column chunks at 8/SM (default_config; the measurements are
# beside it).
FINE_CHUNK_MAX_COLS = 32768
# Entries per row of the compacting path's candidate list. In the H200 runs the 16-bit prefix bin
# held ~36 of 65,536 columns of ReLU'd normal logits; a row whose bin outgrows the list still
# comes out exact, but one program then reads the row (0.36-0.41 ms at 64k), hence a generous list.
CANDIDATES = 4096

# ---------------------------------------------------------------- torch reference


def topk_indices_torch(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """Reference: torch.topk over each row's first lengths[t] columns, short rows 0..len-1 then -1.

    Columns past a row's length rank as -inf and an -inf inside it as the lowest finite fp32 value,
    so a row with fewer than k finite values still selects only columns inside its length (the one
    order this changes, an -inf tied with -3.4e38, never reaches the engine: its indexer logits are
    finite). One elementwise pass more than masking alone: an exact integer key took four, ~4 % of
    a 64k prefill on an H200 when this path served prefill chunks (benchmarks/RESULTS.md)."""
    t, n = logits.shape
    lengths = lengths.long()
    out = torch.full((t, k), -1, dtype=torch.int32, device=logits.device)
    col = torch.arange(n, device=logits.device)
    inside = logits.float().clamp_min(torch.finfo(torch.float32).min)  # NaN stays NaN
    masked = torch.where(col[None, :] < lengths[:, None], inside, float("-inf"))
    if n:
        _, idx = masked.topk(min(k, n), dim=1)
        out[:, : idx.shape[1]] = idx.int()
    short = lengths <= k
    slot = torch.arange(k, device=logits.device)
    ramp = torch.where(slot[None, :] < lengths[:, None], slot[None, :], -1).int()
    return torch.where(short[:, None], ramp, out)


# ---------------------------------------------------------------- Triton kernel


RADIX_LEVELS = tl.constexpr(4)  # 8-bit digits of a 32-bit key, most significant first
# Ints per row of the counter table: a row's counters get a 128-byte line of their own, so rows
# counting at once do not share one.
COUNTER_STRIDE = tl.constexpr(32)


@triton.jit
def _digit_shift(level):
    """Right shift of level's digit; level may be a plain int (interpreter) or a tensor."""
    return (tl.zeros((), tl.int32) + 24 - 8 * level).to(tl.uint32)


@triton.jit
def _load_keys(row_ptr, start, hi, BLOCK: tl.constexpr):
    """Columns start..start+BLOCK, their ordered keys and which of them lie below hi."""
    col = start + tl.arange(0, BLOCK)
    valid = col < hi
    return col, ordered_key(tl.load(row_ptr + col, mask=valid, other=0.0)), valid


@triton.jit
def _digit_histogram(key, match, shift):
    """256-bin histogram of the digit at `shift` over the keys where match holds."""
    # A masked histogram, not a 512-bin one with the other keys in a dropped half: on NVIDIA the
    # histogram is a ballot per bin-index bit plus, per lane, a popcount for each bin it owns, so
    # its cost grows with the bin count (16 bins a lane at 512, 8 at 256 plus one mask ballot).
    return tl.histogram(((key >> shift) & 0xFF).to(tl.int32), 256, mask=match)


@triton.jit
def _narrow_prefix(hist, level, prefix, prefix_mask, remaining):
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
    shift = _digit_shift(level)
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
def _slots_of(pos, mask, table_row, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr):
    """With TO_SLOTS, the cache slots of positions of one request (table_row: its block table row)
    where mask holds; else the positions themselves."""
    if TO_SLOTS:
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=mask, other=0)
        return block * BLOCK_SIZE + pos % BLOCK_SIZE
    else:
        return pos


@triton.jit
def _table_row(table_ptr, seq_ids_ptr, table_stride, TO_SLOTS: tl.constexpr):
    """The block table row of the request of program_id(0)'s row (unread without TO_SLOTS)."""
    if TO_SLOTS:
        return table_ptr + tl.load(seq_ids_ptr + tl.program_id(0)).to(tl.int64) * table_stride
    else:
        return table_ptr


@triton.jit
def _store_short_row_slots(out_row, length, k, table_row, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr,
                           BLOCK: tl.constexpr):
    """A row no longer than k: positions (or with TO_SLOTS their slots) 0..len-1, then -1."""
    for start in range(0, k, BLOCK):
        slot = start + tl.arange(0, BLOCK)
        inside = slot < length
        dest = _slots_of(slot, inside, table_row, BLOCK_SIZE, TO_SLOTS)
        tl.store(out_row + slot, tl.where(inside, dest, -1), mask=slot < k)


@triton.jit
def _store_short_row(out_row, length, k, BLOCK: tl.constexpr):
    """A row no longer than k: 0..len-1 then -1."""
    _store_short_row_slots(out_row, length, k, out_row, 1, False, BLOCK)


@triton.jit
def _replay_prefix(hist_ptr, row, level, k):
    """Redo the digit choices of the levels before `level` from the row's stored histograms."""
    prefix = tl.full((), 0, tl.uint32)
    prefix_mask = tl.full((), 0, tl.uint32)
    remaining = k
    for lv in range(0, level):
        hist = tl.load(hist_ptr + (row * SPLIT_LEVEL + lv) * 256 + tl.arange(0, 256))
        prefix, prefix_mask, remaining = _narrow_prefix(hist, lv, prefix, prefix_mask, remaining)
    return prefix, prefix_mask, remaining


@triton.jit
def _load_entries(keys_ptr, cols_ptr, start, hi, FROM_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Entries start..start+BLOCK below hi: of a row (column = position, key from the logits), or of
    a candidate list (stored ordered keys and columns). Returns columns, keys, validity."""
    if FROM_ROW:
        return _load_keys(keys_ptr, start, hi, BLOCK)
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
def _radix_levels(keys_ptr, cols_ptr, n, prefix, prefix_mask, remaining, first_level, FROM_ROW: tl.constexpr,
                  BLOCK: tl.constexpr):
    """The radix select's levels from first_level on in one program over n entries (`_load_entries`)
    whose keys match (prefix, prefix_mask), each level re-reading them with its histogram in
    registers. Returns the k-th largest key, how many entries equal to it belong to the top k,
    and how many entries equal it."""
    n_equal = tl.full((), 0, tl.int32)
    for level in range(first_level, RADIX_LEVELS):
        shift = _digit_shift(level)
        hist = tl.zeros((256,), tl.int32)
        for start in range(0, n, BLOCK):
            col, key, valid = _load_entries(keys_ptr, cols_ptr, start, n, FROM_ROW, BLOCK)
            hist += _digit_histogram(key, valid & ((key & prefix_mask) == prefix), shift)
        prefix, prefix_mask, remaining = _narrow_prefix(hist, level, prefix, prefix_mask, remaining)
        # entries matching the prefix so far with its new digit: after the last level, those equal
        # to the k-th largest key
        n_equal = tl.sum(tl.where(tl.arange(0, 256) == ((prefix >> shift) & 0xFF).to(tl.int32), hist, 0), axis=0)
    return prefix, remaining, n_equal


@triton.jit
def _select_in_program(keys_ptr, cols_ptr, n, out_row, k, prefix, prefix_mask, remaining, first_level,
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
    prefix, remaining, n_equal = _radix_levels(keys_ptr, cols_ptr, n, prefix, prefix_mask, remaining, first_level,
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


@triton.jit
def _row_of_program(logits_ptr, lengths_ptr, out_ptr, n_cols, k):
    """(the length clamped to the row, the row's logits, its output) of the row of program_id(0)."""
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    return length, logits_ptr + row.to(tl.int64) * n_cols, out_ptr + row.to(tl.int64) * k


# The in-register kernel's emit packs two counts of a block into one int32 (above the k-th largest
# key in the high half, kept below 2^15 by this bound, candidates in the low): the longest row it
# takes; longer rows of the single launch take the radix kernel.
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
    The pivot's arithmetic is fp32 and 32-bit: each step waits on it, and with 64-bit integers a
    step cost ~0.1 us more on an H200 (benchmarks/RESULTS.md); only the clamp to (lo, top] is exact.
    One pivot per block reduction: two or three (thirds with both counts packed in one int32, or
    quarters by one three-value reduction) took as long or longer on an H200 with bisection
    (benchmarks/RESULTS.md, top-k with the row in registers): their extra compares cost what the
    fewer steps saved.
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
def _search_kth_key(key, valid, length, k):
    """(lo, top, c_hi): the k-th largest key lies in [lo, top], c_hi < k keys lie above top and
    every key in [lo, top] belongs to the top k: exactly k keys lie at or above lo, or lo == top.

    Two reductions bound the interval by the row's largest and smallest keys (a row of one value
    ends there; on an H200 the largest alone, or both in one two-value reduction, took longer:
    benchmarks/RESULTS.md), then interpolation steps (_interpolation_step). Once k - 1 keys lie
    above top, the k-th largest is the largest key at or below top: one max reduction finds it
    and ends the search, where landing exactly on k by counts would take several steps.
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
    it writes their cache slots (`_slots_of`), looked up for every column before the search, whose
    loads then overlap the search rather than follow it.

    The k-th largest key is found by narrowing a key interval [lo, top] (_search_kth_key), each
    count of the keys at or above a pivot one block reduction (no histogram), until exactly k keys
    lie at or above lo (the k largest, whatever ties lie below) or the interval is one key (lo is
    the k-th largest). Then one emit: the keys above top, then keys in [lo, top] while fewer than
    k are placed, positions from one packed scan.
    """
    col = tl.arange(0, BLOCK)
    valid = col < length
    # columns past the length get key 0 and never count: every pivot is above 0
    key = tl.where(valid, ordered_key(tl.load(row_ptr + col, mask=valid, other=0.0)), 0)
    dest = _slots_of(col, valid, table_row, BLOCK_SIZE, TO_SLOTS)
    lo, top, c_hi = _search_kth_key(key, valid, length, k)
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
    length, row_ptr, out_row = _row_of_program(logits_ptr, lengths_ptr, out_ptr, n_cols, k)
    table_row = _table_row(table_ptr, seq_ids_ptr, table_stride, TO_SLOTS)
    if length <= k:
        _store_short_row_slots(out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)
    elif length <= BLOCK // 2:
        _select_in_registers(row_ptr, out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK // 2)
    else:
        _select_in_registers(row_ptr, out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)


@triton.jit(do_not_specialize=["level"])
def _histogram_pass_kernel(logits_ptr, lengths_ptr, hist_ptr, n_cols, k, level, CHUNK: tl.constexpr,
                           BLOCK: tl.constexpr):
    """One histogram level of the compacting path over one row (grid: rows x programs per row):
    adds the histogram of level's digit, over the keys that match the prefix chosen so far, into
    hist[row, level].

    Program p takes the row's chunks p, p + P, ... up to the row's length, a bound read on the
    device, so the grid depends only on the shapes (a CUDA graph replays it for any lengths).
    """
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    if length > k:  # short rows: the finish kernel
        row_ptr = logits_ptr + row.to(tl.int64) * n_cols
        prefix, prefix_mask, remaining = _replay_prefix(hist_ptr, row, level, k)
        first, step = tl.program_id(1) * CHUNK, tl.num_programs(1) * CHUNK
        shift = _digit_shift(level)
        hist = tl.zeros((256,), tl.int32)
        for lo in range(first, length, step):
            hi = tl.minimum(lo + CHUNK, length)
            for start in range(lo, hi, BLOCK):
                col, key, valid = _load_keys(row_ptr, start, hi, BLOCK)
                hist += _digit_histogram(key, valid & ((key & prefix_mask) == prefix), shift)
        tl.atomic_add(hist_ptr + (row * SPLIT_LEVEL + level) * 256 + tl.arange(0, 256), hist, sem="relaxed")


# The compacting path fixes this many 8-bit digits with full-row histogram passes before it splits
# the rows: two leave a 16-bit prefix (sign, exponent, 7 mantissa bits: 1/128 of an octave), whose
# boundary bin holds a small fraction of a row unless its values crowd together or tie.
SPLIT_LEVEL = tl.constexpr(2)


@triton.jit
def _boundary_bin_count(hist_ptr, row, prefix):
    """How many of the row's keys share the prefix of the first SPLIT_LEVEL digits: the last
    histogram level's count at the chosen digit."""
    digit = (prefix >> _digit_shift(SPLIT_LEVEL - 1)) & 0xFF
    return tl.load(hist_ptr + (row * SPLIT_LEVEL + SPLIT_LEVEL - 1) * 256 + digit.to(tl.int32))


@triton.jit
def _place_by_scan(counters, is_above, is_cand):
    """Output and list slots of a block's hits: one atomic per counter claims a range for the
    block, one scan orders both kinds of hit (above in the high half of an int32, candidates in
    the low: TopkConfig keeps a block below 2^15 columns, so neither half overflows)."""
    packed = (is_above.to(tl.int32) << 16) | is_cand.to(tl.int32)
    rank = tl.cumsum(packed, axis=0)
    total = tl.sum(packed, axis=0)
    n_above, n_cand = total >> 16, total & 0xFFFF
    above_before = tl.atomic_add(counters, n_above, mask=n_above > 0, sem="relaxed")
    cand_before = tl.atomic_add(counters + 1, n_cand, mask=n_cand > 0, sem="relaxed")
    return above_before + (rank >> 16) - 1, cand_before + (rank & 0xFFFF) - 1


@triton.jit
def _split_kernel(
    logits_ptr, lengths_ptr, out_ptr, hist_ptr, count_ptr, cand_ptr, n_cols, k, cap,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    """The compacting path's split pass (grid: rows x programs per row, like the radix passes).

    With the first SPLIT_LEVEL digits of the k-th largest key known, each column whose key is above
    that prefix goes straight to the output, and each column in the prefix's bin (the candidates)
    to the row's candidate list (keys, then columns: cand[row, 0] and cand[row, 1], cap entries
    each) if the whole bin fits there; the row's counters give the slots.
    """
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    if length > k:  # short rows: the finish kernel
        row_ptr = logits_ptr + row.to(tl.int64) * n_cols
        out_row = out_ptr + row.to(tl.int64) * k
        cand_keys = cand_ptr + row.to(tl.int64) * 2 * cap
        counters = count_ptr + row * COUNTER_STRIDE
        prefix, prefix_mask, remaining = _replay_prefix(hist_ptr, row, SPLIT_LEVEL, k)
        # candidates are listed from columns below cand_end: the row's end if its whole bin fits
        cand_end = tl.where(_boundary_bin_count(hist_ptr, row, prefix) <= cap, length, 0)
        first, step = tl.program_id(1) * CHUNK, tl.num_programs(1) * CHUNK
        for lo in range(first, length, step):
            hi = tl.minimum(lo + CHUNK, length)
            for start in range(lo, hi, BLOCK):
                col, key, valid = _load_keys(row_ptr, start, hi, BLOCK)
                top = key & prefix_mask
                is_above = valid & (top > prefix)
                is_cand = valid & (col < cand_end) & (top == prefix)
                above_slot, cand_slot = _place_by_scan(counters, is_above, is_cand)
                tl.store(out_row + above_slot, col, mask=is_above)
                tl.store(cand_keys + cand_slot, key.to(tl.int32, bitcast=True), mask=is_cand)
                tl.store(cand_keys + cap + cand_slot, col, mask=is_cand)


# Bitmap words the compacting path's finish counts at a time when it orders a row (_order_by_bitmap).
ORDER_WORDS_BLOCK = 1024


@triton.jit
def _popcount(words):
    """Set bits of each int32 word (SWAR on uint32: no popcount intrinsic, which is not portable)."""
    x = words.to(tl.uint32, bitcast=True)
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _order_by_bitmap(out_row, k, length, bits_row, ranks_row, K_BLOCK: tl.constexpr, W_BLOCK: tl.constexpr):
    """Rewrite a row's k distinct columns (each below length) in ascending order, as a counting
    sort: each column sets its bit in a zeroed bitmap of the row (an atomic OR, whose result does
    not depend on the order of the ORs), a scan of the words' bit counts gives each word's count
    of set bits before it (ranks_row), and a column's place is that count plus the set bits below
    it in its word. O(k + length / 32) work, where a bitonic sort of k values (tl.sort) costs
    O(k log^2 k): on an H200 the top-k of 16 x 65,536 columns, k 2,048, took 35.2 us with this
    ordering, 55.3 with the sort and 31.5 unordered (benchmarks/RESULTS.md, deterministic top-k)."""
    i = tl.arange(0, K_BLOCK)
    ok = i < k
    cols = tl.load(out_row + i, mask=ok, other=0)
    word = cols >> 5
    bit = cols & 31
    tl.atomic_or(bits_row + word, 1 << bit, mask=ok, sem="relaxed")
    tl.debug_barrier()  # every bit set before any thread counts them
    carried = tl.full((), 0, tl.int32)
    for start in range(0, tl.cdiv(length, 32), W_BLOCK):
        w = start + tl.arange(0, W_BLOCK)
        inside = w < tl.cdiv(length, 32)
        counts = _popcount(tl.load(bits_row + w, mask=inside, other=0))
        tl.store(ranks_row + w, carried + tl.cumsum(counts, axis=0) - counts, mask=inside)
        carried += tl.sum(counts, axis=0)
    tl.debug_barrier()  # every word's rank stored before any thread reads one
    below = _popcount(tl.load(bits_row + word, mask=ok, other=0) & ~(-1 << bit))
    place = tl.load(ranks_row + word, mask=ok, other=0) + below
    tl.store(out_row + place, cols, mask=ok)


@triton.jit
def _finish_kernel(logits_ptr, lengths_ptr, out_ptr, hist_ptr, cand_ptr, bits_ptr, n_cols, k, cap,
                   BLOCK: tl.constexpr, K_BLOCK: tl.constexpr, W_BLOCK: tl.constexpr):
    """The compacting path's last launch (grid: rows): the remaining digits and the emit over the
    row's candidates in one program, then the row's k outputs put in ascending order (K_BLOCK: k
    rounded up to a power of two) by `_order_by_bitmap` over the row's zeroed bitmap and word
    ranks (bits_ptr: 2 * cdiv(n_cols, 32) int32 per row); short rows 0..len-1 then -1.

    A row whose candidates did not fit the list (values crowding into one 16-bit prefix, or many
    equal values) finishes over the row itself instead, filtered by the prefix: exact, slower.

    The ordering makes the output deterministic: the split placed its columns in the order its
    programs reached the row's atomic counters, which varies from run to run, and the sparse
    attention sums its rows in the order it gets them, so that order would change the last bits
    of the attention's output (and, at a near-tie, a greedy token) between two runs of one step.
    """
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    out_row = out_ptr + row.to(tl.int64) * k
    if length <= k:
        _store_short_row(out_row, length, k, BLOCK)
    else:
        prefix, prefix_mask, remaining = _replay_prefix(hist_ptr, row, SPLIT_LEVEL, k)
        n_cand = _boundary_bin_count(hist_ptr, row, prefix)
        if n_cand <= cap:
            cand_keys = cand_ptr + row.to(tl.int64) * 2 * cap
            _select_in_program(cand_keys, cand_keys + cap, n_cand, out_row, k, prefix, prefix_mask, remaining,
                               SPLIT_LEVEL, False, BLOCK)
        else:
            row_ptr = logits_ptr + row.to(tl.int64) * n_cols
            _select_in_program(row_ptr, row_ptr, length, out_row, k, prefix, prefix_mask, remaining,
                               SPLIT_LEVEL, True, BLOCK)
        # every thread's stores above (and the split's, an earlier launch) visible to every thread
        tl.debug_barrier()
        words = tl.cdiv(n_cols, 32)
        bits_row = bits_ptr + row.to(tl.int64) * 2 * words
        _order_by_bitmap(out_row, k, length, bits_row, bits_row + words, K_BLOCK, W_BLOCK)


# ---------------------------------------------------------------- the sampled path


# The sampled path's sample: up to this many columns of a row, one drawn from each window of
# cdiv(length, SAMPLE_COLS) columns. Its threshold's rank sits SAMPLE_SIGMAS binomial standard
# deviations past the k-th largest's expected rank in the sample, so a row keeps fewer than k
# columns at or above it about once in 10^9 rows (then the row finishes over itself, exact).
SAMPLE_COLS = 8192
SAMPLE_SIGMAS = tl.constexpr(6.0)
# Bitmap words the sampled path's finish turns into a column list at a time (`_bitmap_to_list`).
LIST_WORDS_BLOCK = 2048


@triton.jit
def _sample_columns(length, SAMPLE: tl.constexpr):
    """(columns, which are drawn, how many) of a row's sample: one column in each window of
    cdiv(length, SAMPLE) columns, at an offset hashed from the window's index (Fibonacci hashing)
    so that a pattern repeating with the window's period does not decide what the sample sees."""
    stride = tl.cdiv(length, SAMPLE)
    drawn = tl.cdiv(length, stride)
    i = tl.arange(0, SAMPLE)
    start = i * stride
    width = tl.maximum(tl.minimum(stride, length - start), 1).to(tl.uint32)
    offset = (((i.to(tl.uint32) * 0x9E3779B1) >> 16) % width).to(tl.int32)
    return start + offset, i < drawn, drawn


@triton.jit
def _sample_kernel(logits_ptr, lengths_ptr, count_ptr, n_cols, k, SAMPLE: tl.constexpr):
    """The sampled path's first launch (grid: rows): a threshold key per row that at least k and,
    almost always, at most about 1.4 k of the row's columns reach (counters[row, 1]), found as an
    order statistic of the row's sample by the in-register search; counters[row, 0] (the split's
    count of the columns that reach it) zeroed. A row no longer than SAMPLE is its own sample and
    its threshold the k-th largest key (`_search_kth_key`'s low end)."""
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    counters = count_ptr + row * COUNTER_STRIDE
    if length > k:
        col, drawn, m = _sample_columns(length, SAMPLE)
        key = tl.where(drawn, ordered_key(tl.load(logits_ptr + row.to(tl.int64) * n_cols + col, mask=drawn,
                                                   other=0.0)), 0)
        # the sample's expected count of the row's top k, past it by SAMPLE_SIGMAS deviations
        expected = m.to(tl.float32) * k / length
        rank = tl.where(m == length, k, (expected + SAMPLE_SIGMAS * tl.sqrt(expected)).to(tl.int32) + 2)
        threshold = tl.full((), 0, tl.uint32)  # a rank past the sample: every column
        if rank < m:
            threshold, top, c_hi = _search_kth_key(key, drawn, m, rank)
        tl.store(counters + 1, threshold.to(tl.int32, bitcast=True))
    tl.store(counters, 0)


@triton.jit
def _mark_kernel(logits_ptr, lengths_ptr, count_ptr, bits_ptr, n_cols, k, words_stride,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """The sampled path's split (grid: rows x programs per row, chunks as the radix passes): a
    bitmap of the columns whose key reaches the row's threshold, written a word (32 columns) at a
    time, each word by the one program whose chunk holds it (no atomics, no zeroing), and their
    count added to counters[row, 0] once per program (a sum: the same whatever the order)."""
    row = tl.program_id(0)
    length = tl.minimum(tl.load(lengths_ptr + row), n_cols)
    if length > k:
        row_ptr = logits_ptr + row.to(tl.int64) * n_cols
        bits_row = bits_ptr + row.to(tl.int64) * words_stride
        counters = count_ptr + row * COUNTER_STRIDE
        threshold = tl.load(counters + 1).to(tl.uint32, bitcast=True)
        lane = tl.arange(0, 32)
        word = tl.arange(0, BLOCK // 32)
        hits = tl.zeros((BLOCK // 32, 32), tl.int32)
        first, step = tl.program_id(1) * CHUNK, tl.num_programs(1) * CHUNK
        for lo in range(first, length, step):
            for start in range(lo, tl.minimum(lo + CHUNK, length), BLOCK):
                col = start + word[:, None] * 32 + lane[None, :]
                valid = col < length
                hit = (valid & (ordered_key(tl.load(row_ptr + col, mask=valid, other=0.0)) >= threshold)).to(tl.int32)
                hits += hit
                # distinct bits: their sum is their OR
                tl.store(bits_row + start // 32 + word, tl.sum(hit << lane[None, :], axis=1),
                         mask=start + word * 32 < length)
        tl.atomic_add(counters, tl.sum(tl.sum(hits, axis=1), axis=0), sem="relaxed")


@triton.jit
def _bitmap_to_list(bits_row, n_words, list_row, W_BLOCK: tl.constexpr):
    """Write the columns of a row's set bits, ascending, to list_row: a scan of the words' bit
    counts places each word's columns, then every word gives up its lowest set bit per step, as
    many steps as the most bits a word of the block holds (a few for a row's top few percent;
    counted once, so that the steps wait on no block-wide reduction)."""
    carried = tl.full((), 0, tl.int32)
    for start in range(0, n_words, W_BLOCK):
        w = start + tl.arange(0, W_BLOCK)
        words = tl.load(bits_row + w, mask=w < n_words, other=0)
        counts = _popcount(words)
        place = carried + tl.cumsum(counts, axis=0) - counts
        carried += tl.sum(counts, axis=0)
        for _ in range(tl.max(counts, axis=0)):
            live = words != 0
            tl.store(list_row + place, w * 32 + _popcount((words & -words) - 1), mask=live)
            place += live.to(tl.int32)
            words = words & (words - 1)


@triton.jit
def _store_in_order(out_row, dest, is_above, is_band, need, taken, band_before):
    """Write, in the order given, the entries above the k-th largest key and the first `need` of
    the band (keys in the top k's lowest range, ties at the k-th value) counting band_before ones
    already seen, after the `taken` entries already written. Returns both counts updated."""
    band_rank = band_before + tl.cumsum(is_band.to(tl.int32), axis=0) - 1
    chosen = is_above | (is_band & (band_rank < need))
    tl.store(out_row + taken + tl.cumsum(chosen.to(tl.int32), axis=0) - 1, dest, mask=chosen)
    return taken + tl.sum(chosen.to(tl.int32), axis=0), band_before + tl.sum(is_band.to(tl.int32), axis=0)


@triton.jit
def _select_row_in_order(row_ptr, out_row, length, k, table_row, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr,
                         BLOCK: tl.constexpr):
    """The top k of a row in one program, in column order: the four radix levels over the row,
    then one emit pass taking ties at the k-th largest key by lowest column."""
    zero = tl.full((), 0, tl.uint32)
    kth, remaining, _ = _radix_levels(row_ptr, row_ptr, length, zero, zero, k, 0, True, BLOCK)
    taken = tl.full((), 0, tl.int32)
    equal_before = tl.full((), 0, tl.int32)
    for start in range(0, length, BLOCK):
        col, key, valid = _load_keys(row_ptr, start, length, BLOCK)
        taken, equal_before = _store_in_order(out_row, _slots_of(col, valid, table_row, BLOCK_SIZE, TO_SLOTS),
                                              valid & (key > kth), valid & (key == kth), remaining, taken,
                                              equal_before)


@triton.jit
def _sampled_finish_kernel(logits_ptr, lengths_ptr, out_ptr, count_ptr, bits_ptr, list_ptr, n_cols, k, words_stride,
                           table_ptr, seq_ids_ptr, table_stride, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr,
                           CAP: tl.constexpr, W_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """The sampled path's last launch (grid: rows): the columns of the row's bitmap listed in
    ascending order (list_ptr: CAP int32 per row), their keys gathered into registers, the k-th
    largest found by the in-register search, and the top k written in column order (ties at the
    k-th value by lowest column), as positions or, with TO_SLOTS, cache slots; short rows
    0..len-1 then -1.

    Exact whenever at least k columns reached the threshold (the top k then lie among them) and
    at most CAP did; any other row (a sample far off its row, or a row of many equal values)
    finishes over the row itself (`_select_row_in_order`): exact, slower."""
    length, row_ptr, out_row = _row_of_program(logits_ptr, lengths_ptr, out_ptr, n_cols, k)
    table_row = _table_row(table_ptr, seq_ids_ptr, table_stride, TO_SLOTS)
    row = tl.program_id(0)
    if length <= k:
        _store_short_row_slots(out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)
    else:
        n_list = tl.load(count_ptr + row * COUNTER_STRIDE)
        if (n_list >= k) & (n_list <= CAP):
            list_row = list_ptr + row.to(tl.int64) * CAP
            _bitmap_to_list(bits_ptr + row.to(tl.int64) * words_stride, tl.cdiv(length, 32), list_row, W_BLOCK)
            tl.debug_barrier()  # every thread's list entries stored before any thread reads one
            i = tl.arange(0, CAP)
            listed = i < n_list
            col = tl.load(list_row + i, mask=listed, other=0)
            key = tl.where(listed, ordered_key(tl.load(row_ptr + col, mask=listed, other=0.0)), 0)
            dest = _slots_of(col, listed, table_row, BLOCK_SIZE, TO_SLOTS)
            lo, top, c_hi = _search_kth_key(key, listed, n_list, k)
            zero = tl.full((), 0, tl.int32)
            _store_in_order(out_row, dest, key > top, listed & (key >= lo) & (key <= top), k - c_hi, zero, zero)
        else:
            _select_row_in_order(row_ptr, out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)


@dataclass(frozen=True)
class TopkConfig:
    """Columns per chunk, columns per loop step (block), warps and programs per multiprocessor
    (the grid) of the multi-launch paths, and the longest row that takes the single launch, one
    program per row of num_warps warps holding the row in registers (at most REGISTER_ROW_MAX_COLS).

    Longer rows take the compacting path with a candidate list of `candidates` entries per row;
    its finish steps `finish_block` entries at a time. Its full-row histogram levels step
    `hist_block` columns at a time (0: `block`; their chunks grow to it): a histogram's per-step
    cost (ballots, a barrier, a shared-memory merge) is shared by more columns, while the split
    keeps the smaller block. The compacting path's finish puts each row's columns in ascending
    order (`_order_by_bitmap`).

    With `sample` > 0, rows past the single launch take the sampled path instead (a sample of up
    to `sample` columns per row, a power of two), whose finish lists up to `candidates` columns
    per row (a power of two: its register block) and which needs candidates >= 2 k (else the
    compacting path); its mark pass steps `block` columns (a multiple of 32) in chunks of `chunk`.
    """

    chunk: int
    block: int
    num_warps: int
    programs_per_sm: int = 4
    single_pass_max_cols: int = SINGLE_PASS_MAX_COLS
    candidates: int = CANDIDATES
    finish_block: int = 512
    hist_block: int = 0
    sample: int = 0

    def __post_init__(self) -> None:
        # the split's scan packs two per-block counts into one int32, the above-count in the high
        # half, which must stay below 2^15 (a whole block above the prefix) to keep the sign bit clear
        if self.block >= 1 << 15:
            raise ValueError(f"TopkConfig: block={self.block} must be below 32768")
        if self.hist_block < 0:
            raise ValueError(f"TopkConfig: hist_block={self.hist_block} must be >= 0")
        if self.candidates <= 0:
            raise ValueError(f"TopkConfig: candidates={self.candidates} must be positive")
        if self.single_pass_max_cols > REGISTER_ROW_MAX_COLS:
            raise ValueError(f"TopkConfig: single_pass_max_cols={self.single_pass_max_cols} must be at most "
                             f"{REGISTER_ROW_MAX_COLS}, the longest row the one-launch kernel holds")
        if self.sample:
            for name in ("sample", "candidates"):
                value = getattr(self, name)
                if value <= 0 or value & (value - 1):
                    raise ValueError(f"TopkConfig: {name}={value} must be a power of two on the sampled path")
            if self.block % 32 or self.chunk % self.block:
                raise ValueError(f"TopkConfig: the sampled path needs a block ({self.block}) of whole 32-column "
                                 f"words and chunks ({self.chunk}) of whole blocks")


def default_config(device: torch.device, n_cols: int, n_rows: int) -> TopkConfig:
    # On CPU the kernel runs in the Triton interpreter, whose cost grows with the number of programs
    # (measured: 2 rows of 2600 columns, k=2048 take 20 s at 64-column chunks, 5.7 s at 256); 256
    # still splits the tests' rows of 700 columns into several chunks of several blocks each. The
    # paths are the GPU's, so that what runs by default in the interpreter is what a GPU runs.
    sampled = n_rows * n_cols > SAMPLED_MIN_COLUMNS
    if device.type != "cuda":
        return TopkConfig(256, 64, 4, finish_block=64, sample=SAMPLE_COLS if sampled else 0)
    # Fastest per shape replayed in a CUDA graph on an H200 (benchmarks/RESULTS.md, top-k launch
    # shapes, compacting top-k, top-k with the row in registers): one program per row holding the
    # row in registers up to 8k columns (SINGLE_PASS_MAX_COLS has the numbers; the block and chunk
    # below serve only a radix single launch); the compacting path beyond, with 1024-column chunks
    # at 16 programs/SM up to 32k
    # (16.1 and 29.1 us at 1 and 128 rows of 32k at 4k context, k=512, where the five launches
    # took 21.3 and 53.0), 2048-column chunks at 8/SM beyond (29.8 vs 45.6 us at 16 x 64k, 80.1 vs
    # 142.0 at 64 x 64k); the finish steps 512 candidates at a time (2 us less than 1024 there).
    # Beyond 32k the histogram levels step 2,048 columns (29.1 vs 29.9 us at 16 x 64k, 74.5 vs 80.1
    # at 64 x 64k; at 32k columns and 4k context they lost, 17.2 vs 16.0 and 30.5 vs 29.1).
    # Batches past SAMPLED_MIN_COLUMNS take the sampled path instead, its mark pass in 2,048-column
    # chunks at 16 programs/SM (25.8 us at 16 x 64k, 31.6 at 64 x 64k; 1,024-column chunks 25.2-25.8
    # and 31.5-31.6: the same within the runs' spread), its sample SAMPLE_COLS and list CANDIDATES
    # (a sample of 4,096 and a list of 8,192: 27.9-28.1 and 32.0-32.4).
    if n_cols <= SINGLE_PASS_MAX_COLS:
        return TopkConfig(4096, 4096, SINGLE_PASS_WARPS)
    if sampled:
        return TopkConfig(2048, 1024, 4, 16, sample=SAMPLE_COLS)
    if n_cols <= FINE_CHUNK_MAX_COLS:
        return TopkConfig(1024, 1024, 4, 16)
    return TopkConfig(2048, 1024, 4, 8, hist_block=2048)


def _spread_grid(t: int, n: int, chunk: int, cfg: TopkConfig, device: torch.device) -> tuple[int, int]:
    """(rows, programs per row) of a pass over chunks of `chunk` columns."""
    return t, row_programs(t, max(1, triton.cdiv(n, chunk)), device, cfg.programs_per_sm)


def takes_register_launch(cfg: TopkConfig, n_cols: int) -> bool:
    """Whether rows of n_cols columns take the in-register one-launch kernel under cfg."""
    return n_cols <= cfg.single_pass_max_cols


@dataclass(frozen=True)
class SlotMap:
    """What maps a row's positions to global cache slots: the block table (int32 [requests,
    blocks]), the request of each row (seq_ids, int32 [T]) and the block size."""

    block_table: torch.Tensor
    seq_ids: torch.Tensor
    block_size: int


def topk_triton(logits: torch.Tensor, lengths: torch.Tensor, k: int, config: TopkConfig | None = None,
                slots: SlotMap | None = None) -> torch.Tensor:
    """One launch over rows up to config.single_pass_max_cols columns (the row in registers);
    beyond, over (rows x programs per row), the sampled path or the compacting path (SPLIT_LEVEL
    histogram levels, the split, then one program per row finishing on its candidates). With
    `slots` the outputs are cache slots: the in-register kernel and the sampled path look them
    up as they write (no second launch); the compacting path maps its positions afterwards."""
    t, n = logits.shape
    out = new_output((t, k), torch.int32, logits.device)
    if t == 0:
        return out
    cfg = config or default_config(logits.device, n, t)
    if takes_register_launch(cfg, n):
        table = slots.block_table.int() if slots else out
        seq_ids = slots.seq_ids.int().contiguous() if slots else lengths
        _topk_in_registers_kernel[(t,)](logits, lengths, out, n, k, table, seq_ids, table.stride(0),
                                        BLOCK_SIZE=slots.block_size if slots else 1, TO_SLOTS=slots is not None,
                                        BLOCK=max(64, triton.next_power_of_2(n)), num_warps=cfg.num_warps)
        return out
    if cfg.sample and 2 * k <= cfg.candidates:
        return _topk_sampled(logits, lengths, out, k, cfg, slots)
    if slots:
        return positions_to_slots(topk_triton(logits, lengths, k, cfg), slots.block_table, slots.seq_ids,
                                  slots.block_size, backend="triton")
    return _topk_compacting(logits, lengths, out, k, cfg)


def _topk_compacting(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int,
                     cfg: TopkConfig) -> torch.Tensor:
    """The compacting path's launches (SPLIT_LEVEL histogram levels, the split, the finish),
    writing positions to out."""
    t, n = logits.shape
    # One zeroed buffer for the scratch tables: one allocation and one fill per call, not several.
    levels, stride, words = SPLIT_LEVEL.value * 256, COUNTER_STRIDE.value, triton.cdiv(n, 32)
    scratch = torch.zeros(t * (levels + stride + 2 * words), dtype=torch.int32, device=logits.device)
    # [t, SPLIT_LEVEL, 256], [t, stride] and [t, 2, words] (the finish's bitmap and word ranks), flat
    hist, counts, bits = scratch.split((t * levels, t * stride, t * 2 * words))
    hist_block = cfg.hist_block or cfg.block
    hist_chunk = max(cfg.chunk, hist_block)
    hist_grid = _spread_grid(t, n, hist_chunk, cfg, logits.device)
    for level in range(SPLIT_LEVEL.value):
        _histogram_pass_kernel[hist_grid](logits, lengths, hist, n, k, level, CHUNK=hist_chunk, BLOCK=hist_block,
                                          num_warps=cfg.num_warps)
    cand = torch.empty(t * 2 * cfg.candidates, dtype=torch.int32, device=logits.device)  # [t, keys|cols, cap]
    _split_kernel[_spread_grid(t, n, cfg.chunk, cfg, logits.device)](
        logits, lengths, out, hist, counts, cand, n, k, cfg.candidates, CHUNK=cfg.chunk, BLOCK=cfg.block,
        num_warps=cfg.num_warps)
    _finish_kernel[(t,)](logits, lengths, out, hist, cand, bits, n, k, cfg.candidates, BLOCK=cfg.finish_block,
                         K_BLOCK=triton.next_power_of_2(k), W_BLOCK=ORDER_WORDS_BLOCK, num_warps=cfg.num_warps)
    return out


def _topk_sampled(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int, cfg: TopkConfig,
                  slots: SlotMap | None) -> torch.Tensor:
    """The sampled path's three launches (a threshold from each row's sample, the bitmap of the
    columns reaching it, the finish over their list), writing positions or cache slots to out."""
    t, n = logits.shape
    words = triton.cdiv(n, 32)
    stride = COUNTER_STRIDE.value
    # counters [t, stride], bitmap [t, words], list [t, candidates]: every entry a launch reads is
    # written by an earlier one, so nothing is zeroed
    scratch = torch.empty(t * (stride + words + cfg.candidates), dtype=torch.int32, device=logits.device)
    counts, bits, listed = scratch.split((t * stride, t * words, t * cfg.candidates))
    _sample_kernel[(t,)](logits, lengths, counts, n, k, SAMPLE=cfg.sample, num_warps=SINGLE_PASS_WARPS)
    _mark_kernel[_spread_grid(t, n, cfg.chunk, cfg, logits.device)](
        logits, lengths, counts, bits, n, k, words, CHUNK=cfg.chunk, BLOCK=cfg.block, num_warps=cfg.num_warps)
    table = slots.block_table.int() if slots else out
    seq_ids = slots.seq_ids.int().contiguous() if slots else lengths
    _sampled_finish_kernel[(t,)](logits, lengths, out, counts, bits, listed, n, k, words, table, seq_ids,
                                 table.stride(0), BLOCK_SIZE=slots.block_size if slots else 1,
                                 TO_SLOTS=slots is not None, CAP=cfg.candidates, W_BLOCK=LIST_WORDS_BLOCK,
                                 BLOCK=cfg.block, num_warps=SINGLE_PASS_WARPS)
    return out


# ---------------------------------------------------------------- public API


def topk_indices(logits: torch.Tensor, lengths: torch.Tensor, k: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: exact top-k column indices among each row's first lengths[t] columns, in an
    order that depends on the row's values alone (ascending on the compacting path).

    Rows with lengths[t] <= k emit 0..len-1 then -1.
    """
    _check_topk_inputs("topk_indices", logits, lengths, k)
    if _takes_torch(logits, backend):
        return topk_indices_torch(logits, lengths, k)
    return topk_triton(logits.contiguous(), lengths.int().contiguous(), k)


def topk_slots(logits: torch.Tensor, lengths: torch.Tensor, k: int, block_table: torch.Tensor,
               seq_ids: torch.Tensor, block_size: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: the cache slots of topk_indices' columns, row t's positions read through
    block_table[seq_ids[t]] in blocks of block_size; -1 stays -1. The same as positions_to_slots
    over topk_indices, in one launch where the top-k takes the in-register kernel (the decode
    step's rows)."""
    _check_topk_inputs("topk_slots", logits, lengths, k)
    if seq_ids.shape != (logits.shape[0],):
        raise ValueError(f"topk_slots: seq_ids must be [T={logits.shape[0]}], got {list(seq_ids.shape)}")
    # a host sync on a GPU (values_checkable): there the context lengths come from a block table
    # that covers them
    if logits.numel() and values_checkable(lengths) and (
            int(lengths.clamp(max=logits.shape[1]).max()) > block_table.shape[1] * block_size):
        raise ValueError("topk_slots: a row's length reaches beyond the block table")
    if _takes_torch(logits, backend):
        top = topk_indices_torch(logits, lengths, k)
        return positions_to_slots(top, block_table, seq_ids, block_size, backend=backend)
    return topk_triton(logits.contiguous(), lengths.int().contiguous(), k,
                       slots=SlotMap(block_table, seq_ids, block_size))


def _check_topk_inputs(op: str, logits: torch.Tensor, lengths: torch.Tensor, k: int) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"{op}: logits must be fp32[T, N], got {logits.dtype}{list(logits.shape)}")
    if lengths.shape != (logits.shape[0],):
        raise ValueError(f"{op}: lengths must be [T={logits.shape[0]}], got {list(lengths.shape)}")
    if k <= 0:
        raise ValueError(f"{op}: k={k} must be positive")


def _takes_torch(logits: torch.Tensor, backend: str | None) -> bool:
    """Whether the top-k of these rows runs the torch path: the backend alone. Prefill chunks take
    the Triton paths too (the sampled path past SINGLE_PASS_MAX_COLS), which torch.topk behind its
    length mask took until measured on an H200 at a chunk of 8,192 ragged rows as cache slots:
    3.9 against 27.0 ms at 160k columns, 1.6 against 11.4 at 64k, 0.46 against 2.2 at 8k (the
    in-register kernel); a v32 prefill of 160k tokens 5.30-5.33 -> 4.34-4.38 s (benchmarks/RESULTS.md,
    long-context prefill at 128k-160k)."""
    return resolve_backend(backend, logits.device) == "torch"


@triton.jit
def _positions_to_slots_kernel(idx_ptr, block_table_ptr, seq_ids_ptr, out_ptr, k, table_stride, block_size,
                               BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = j < k
    pos = tl.load(idx_ptr + t * k + j, mask=ok, other=-1)
    valid = pos >= 0
    pos = tl.where(valid, pos, 0)
    table_row = block_table_ptr + tl.load(seq_ids_ptr + t).to(tl.int64) * table_stride
    block = tl.load(table_row + pos // block_size, mask=ok & valid, other=0)
    tl.store(out_ptr + t * k + j, tl.where(valid, block * block_size + pos % block_size, -1), mask=ok)


def positions_to_slots_reference(idx: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor,
                                 block_size: int) -> torch.Tensor:
    valid = idx >= 0
    pos = torch.where(valid, idx, 0)
    blocks = block_table[seq_ids[:, None], pos // block_size]
    return torch.where(valid, blocks * block_size + pos % block_size, -1).int()


def positions_to_slots(idx: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor,
                       block_size: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: positions idx[T, k] of request seq_ids[t] mapped to global slots through the
    block table; -1 stays -1. One kernel on the Triton backend (the torch code is a dozen)."""
    if idx.dim() != 2 or seq_ids.shape != (idx.shape[0],):
        raise ValueError(f"positions_to_slots: idx [T, k] and seq_ids [T] expected, "
                         f"got {list(idx.shape)}, {list(seq_ids.shape)}")
    # a host sync on a GPU (values_checkable): there top-k positions come from context lengths
    # that the block table already covers
    if idx.numel() and values_checkable(idx) and int(idx.max()) >= block_table.shape[1] * block_size:
        raise ValueError("positions_to_slots: a position lies beyond the block table")
    if resolve_backend(backend, idx.device) == "torch":
        return positions_to_slots_reference(idx, block_table, seq_ids, block_size)
    t, k = idx.shape
    out = new_output((t, k), torch.int32, idx.device)
    if t and k:
        table = block_table.int()
        block = min(1024, triton.next_power_of_2(k))
        _positions_to_slots_kernel[(t, triton.cdiv(k, block))](
            idx.int().contiguous(), table, seq_ids.int().contiguous(), out, k, table.stride(0), block_size,
            BLOCK=block, num_warps=4)
    return out
