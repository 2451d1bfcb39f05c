"""The sampled top-k, for long rows in batches of many columns; three launches and one full-row
pass. One program per row draws a sample of up to `TopkConfig.sample` columns and takes as
threshold the key of a rank in it that, by a binomial margin, at least k of the row's columns
reach; a mark pass writes the bitmap of the columns that reach it (a word per 32 columns, each by
one program: no atomics but one count per program); one program per row then lists the marked
columns in ascending order from the bitmap, gathers their keys into registers, finds the k-th
largest with the in-register search and writes the top k in column order (ties by lowest column),
as positions or cache slots.

Exact and run-to-run identical by construction. A row with fewer than k or more than
`TopkConfig.candidates` marked columns (a sample far off its row: about once in 10^9 rows of
continuous values; rows of many equal values) finishes over the row itself, slower. The one
full-row pass is a compare and a word per 32 columns, fewer instructions a column than one
histogram level (`benchmarks/topk_sass.py` counts them): it wins once a batch's full-row passes
outweigh the chains of block reductions its three launches wait on."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.topk.config import SINGLE_PASS_WARPS, TopkConfig
from kernels.topk.in_registers import search_kth_key
from kernels.topk.radix import radix_levels
from kernels.topk.rows import COUNTER_STRIDE, load_keys, popcount, row_of_program, store_short_row_slots
from kernels.topk.slots import SlotMap, request_table_row, slot_args, slots_of
from kernels.triton_utils import ordered_key

# The threshold's rank sits SAMPLE_SIGMAS binomial standard deviations past the k-th largest's
# expected rank in the sample, so a row keeps fewer than k columns at or above it about once in
# 10^9 rows (then the row finishes over itself, exact).
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
    its threshold the k-th largest key (`search_kth_key`'s low end)."""
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
            threshold, top, c_hi = search_kth_key(key, drawn, m, rank)
        tl.store(counters + 1, threshold.to(tl.int32, bitcast=True))
    tl.store(counters, 0)


@triton.jit
def _mark_kernel(logits_ptr, lengths_ptr, count_ptr, bits_ptr, n_cols, k, words_stride,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """The sampled path's split (grid: rows x programs per row, chunks as the compacting passes): a
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
        counts = popcount(words)
        place = carried + tl.cumsum(counts, axis=0) - counts
        carried += tl.sum(counts, axis=0)
        for _ in range(tl.max(counts, axis=0)):
            live = words != 0
            tl.store(list_row + place, w * 32 + popcount((words & -words) - 1), mask=live)
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
    kth, remaining, _ = radix_levels(row_ptr, row_ptr, length, zero, zero, k, 0, True, BLOCK)
    taken = tl.full((), 0, tl.int32)
    equal_before = tl.full((), 0, tl.int32)
    for start in range(0, length, BLOCK):
        col, key, valid = load_keys(row_ptr, start, length, BLOCK)
        taken, equal_before = _store_in_order(out_row, slots_of(col, valid, table_row, BLOCK_SIZE, TO_SLOTS),
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
    length, row_ptr, out_row = row_of_program(logits_ptr, lengths_ptr, out_ptr, n_cols, k)
    table_row = request_table_row(table_ptr, seq_ids_ptr, table_stride, TO_SLOTS)
    row = tl.program_id(0)
    if length <= k:
        store_short_row_slots(out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)
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
            dest = slots_of(col, listed, table_row, BLOCK_SIZE, TO_SLOTS)
            lo, top, c_hi = search_kth_key(key, listed, n_list, k)
            zero = tl.full((), 0, tl.int32)
            _store_in_order(out_row, dest, key > top, listed & (key >= lo) & (key <= top), k - c_hi, zero, zero)
        else:
            _select_row_in_order(row_ptr, out_row, length, k, table_row, BLOCK_SIZE, TO_SLOTS, BLOCK)


def topk_sampled(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int, cfg: TopkConfig,
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
    _mark_kernel[cfg.grid(t, n, cfg.chunk, logits.device)](
        logits, lengths, counts, bits, n, k, words, CHUNK=cfg.chunk, BLOCK=cfg.block, num_warps=cfg.num_warps)
    table, seq_ids, block_size = slot_args(slots, out, lengths)
    _sampled_finish_kernel[(t,)](logits, lengths, out, counts, bits, listed, n, k, words, table, seq_ids,
                                 table.stride(0), BLOCK_SIZE=block_size,
                                 TO_SLOTS=slots is not None, CAP=cfg.candidates, W_BLOCK=LIST_WORDS_BLOCK,
                                 BLOCK=cfg.block, num_warps=SINGLE_PASS_WARPS)
    return out
