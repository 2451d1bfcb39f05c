"""The compacting top-k, for long rows in batches too small for the sampled path; four launches.
Two histogram levels over the whole row (`radix.py`'s digits, the programs of a row adding into a
per-row table in global memory) fix the top 16 bits of the k-th largest key; a split pass writes
the columns above that prefix to the output and those in its bin (the candidates, a small share of
a row) to a per-row list, both placed by atomic counters; one program per row then finishes the
last two levels and the emit on its list alone, and puts the row in ascending column order.

The order matters because the split's atomics place columns in an order that varies from run to
run, and the sparse attention's sums follow the order it is given: unordered, two runs of one
step would differ in their last bits. Ties at the k-th value go to the lowest columns, as on the
other paths. A row whose candidates overflow the list (values crowding into one prefix, or many
ties) finishes over the row itself: exact, slower.

Each histogram pass is bound by instruction issue, not memory: the path's gain is the full-row
passes it leaves out, and its histogram levels may step more columns at a time than the split
(`TopkConfig.hist_block`), which spreads a histogram's per-step cost over more columns."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.topk.config import TopkConfig
from kernels.topk.radix import digit_histogram, digit_shift, narrow_prefix, select_in_program
from kernels.topk.rows import COUNTER_STRIDE, load_keys, popcount, store_short_row

# The compacting path fixes this many 8-bit digits with full-row histogram passes before it splits
# the rows: two leave a 16-bit prefix (sign, exponent, 7 mantissa bits: 1/128 of an octave), whose
# boundary bin holds a small fraction of a row unless its values crowd together or tie.
SPLIT_LEVEL = tl.constexpr(2)


@triton.jit
def _replay_prefix(hist_ptr, row, level, k):
    """Redo the digit choices of the levels before `level` from the row's stored histograms."""
    prefix = tl.full((), 0, tl.uint32)
    prefix_mask = tl.full((), 0, tl.uint32)
    remaining = k
    for lv in range(0, level):
        hist = tl.load(hist_ptr + (row * SPLIT_LEVEL + lv) * 256 + tl.arange(0, 256))
        prefix, prefix_mask, remaining = narrow_prefix(hist, lv, prefix, prefix_mask, remaining)
    return prefix, prefix_mask, remaining


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
        shift = digit_shift(level)
        hist = tl.zeros((256,), tl.int32)
        for lo in range(first, length, step):
            hi = tl.minimum(lo + CHUNK, length)
            for start in range(lo, hi, BLOCK):
                col, key, valid = load_keys(row_ptr, start, hi, BLOCK)
                hist += digit_histogram(key, valid & ((key & prefix_mask) == prefix), shift)
        tl.atomic_add(hist_ptr + (row * SPLIT_LEVEL + level) * 256 + tl.arange(0, 256), hist, sem="relaxed")


@triton.jit
def _boundary_bin_count(hist_ptr, row, prefix):
    """How many of the row's keys share the prefix of the first SPLIT_LEVEL digits: the last
    histogram level's count at the chosen digit."""
    digit = (prefix >> digit_shift(SPLIT_LEVEL - 1)) & 0xFF
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
    """The compacting path's split pass (grid: rows x programs per row, like the histogram passes).

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
                col, key, valid = load_keys(row_ptr, start, hi, BLOCK)
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
def _order_by_bitmap(out_row, k, length, bits_row, ranks_row, K_BLOCK: tl.constexpr, W_BLOCK: tl.constexpr):
    """Rewrite a row's k distinct columns (each below length) in ascending order, as a counting
    sort: each column sets its bit in a zeroed bitmap of the row (an atomic OR, whose result does
    not depend on the order of the ORs), a scan of the words' bit counts gives each word's count
    of set bits before it (ranks_row), and a column's place is that count plus the set bits below
    it in its word. O(k + length / 32) work, where a bitonic sort of k values (tl.sort) costs
    O(k log^2 k): ordering this way adds a small part of the unordered path's time, the sort
    several times as much (`benchmarks/topk_determinism.py --profile` shows the finish's share)."""
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
        counts = popcount(tl.load(bits_row + w, mask=inside, other=0))
        tl.store(ranks_row + w, carried + tl.cumsum(counts, axis=0) - counts, mask=inside)
        carried += tl.sum(counts, axis=0)
    tl.debug_barrier()  # every word's rank stored before any thread reads one
    below = popcount(tl.load(bits_row + word, mask=ok, other=0) & ~(-1 << bit))
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
        store_short_row(out_row, length, k, BLOCK)
    else:
        prefix, prefix_mask, remaining = _replay_prefix(hist_ptr, row, SPLIT_LEVEL, k)
        n_cand = _boundary_bin_count(hist_ptr, row, prefix)
        if n_cand <= cap:
            cand_keys = cand_ptr + row.to(tl.int64) * 2 * cap
            select_in_program(cand_keys, cand_keys + cap, n_cand, out_row, k, prefix, prefix_mask, remaining,
                              SPLIT_LEVEL, False, BLOCK)
        else:
            row_ptr = logits_ptr + row.to(tl.int64) * n_cols
            select_in_program(row_ptr, row_ptr, length, out_row, k, prefix, prefix_mask, remaining,
                              SPLIT_LEVEL, True, BLOCK)
        # every thread's stores above (and the split's, an earlier launch) visible to every thread
        tl.debug_barrier()
        words = tl.cdiv(n_cols, 32)
        bits_row = bits_ptr + row.to(tl.int64) * 2 * words
        _order_by_bitmap(out_row, k, length, bits_row, bits_row + words, K_BLOCK, W_BLOCK)


def topk_compacting(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int,
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
    hist_grid = cfg.grid(t, n, hist_chunk, logits.device)
    for level in range(SPLIT_LEVEL.value):
        _histogram_pass_kernel[hist_grid](logits, lengths, hist, n, k, level, CHUNK=hist_chunk, BLOCK=hist_block,
                                          num_warps=cfg.num_warps)
    cand = torch.empty(t * 2 * cfg.candidates, dtype=torch.int32, device=logits.device)  # [t, keys|cols, cap]
    _split_kernel[cfg.grid(t, n, cfg.chunk, logits.device)](
        logits, lengths, out, hist, counts, cand, n, k, cfg.candidates, CHUNK=cfg.chunk, BLOCK=cfg.block,
        num_warps=cfg.num_warps)
    _finish_kernel[(t,)](logits, lengths, out, hist, cand, bits, n, k, cfg.candidates, BLOCK=cfg.finish_block,
                         K_BLOCK=triton.next_power_of_2(k), W_BLOCK=ORDER_WORDS_BLOCK, num_warps=cfg.num_warps)
    return out
