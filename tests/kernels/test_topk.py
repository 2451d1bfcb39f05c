"""Top-k indices: every Triton path (one launch in registers, compacting, sampled) vs the torch
reference vs torch.topk, compared on selected values; top-k slots (the indices mapped through a
block table) vs the two references composed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl

from kernels import positions_to_slots, topk_indices, topk_slots
from kernels.topk import (
    SlotMap,
    TopkConfig,
    compacting,
    config,
    default_config,
    in_registers,
    positions_to_slots_reference,
    sampled,
    topk_indices_torch,
    topk_triton,
)
from kernels.topk import slots as slot_kernels
from kernels.topk.in_registers import REGISTER_ROW_MAX_COLS
from kernels.triton_utils import ordered_key
from tests.kernels.checks import selected_values

CPU_CONFIG = default_config(torch.device("cpu"), 0, 1)
# Each Triton check runs every path, whatever the default picks at its size: the one-launch kernel
# with the row in registers, the compacting path with a candidate list no row outgrows (histogram
# levels at the split's steps, wider ones, and chunks grown to them), and with one that every row
# with two candidates overflows; the sampled path with a sample of a few columns per window (rows
# past 128 columns) and with rows their own sample.
PATHS = {"one launch in registers": replace(CPU_CONFIG, single_pass_max_cols=REGISTER_ROW_MAX_COLS),
         "compacting": replace(CPU_CONFIG, single_pass_max_cols=0, candidates=1 << 12),
         "compacting, list overflows": replace(CPU_CONFIG, single_pass_max_cols=0, candidates=1),
         "compacting, wider histogram steps": replace(CPU_CONFIG, single_pass_max_cols=0, candidates=1 << 12,
                                                      hist_block=2 * CPU_CONFIG.block),
         "compacting, histogram chunks grown": replace(CPU_CONFIG, single_pass_max_cols=0, candidates=1 << 12,
                                                       hist_block=2 * CPU_CONFIG.chunk),
         "sampled": replace(CPU_CONFIG, single_pass_max_cols=0, candidates=1 << 12, sample=128),
         "sampled, rows their own sample": replace(CPU_CONFIG, single_pass_max_cols=0, candidates=1 << 12,
                                                   sample=1 << 12)}


def ordered_keys(x: torch.Tensor) -> torch.Tensor:
    """The kernel's order-preserving 32-bit keys of fp32 values, as int64."""
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(bits >= 1 << 31, bits ^ 0xFFFFFFFF, bits ^ (1 << 31))


def candidate_count(row: torch.Tensor, k: int) -> int:
    """Columns of a row (len > k) sharing the top 16 key bits of its k-th largest: the compacting
    path's candidates."""
    keys = ordered_keys(row)
    kth = int(keys.topk(k).values[-1])
    return int(((keys >> 16) == kth >> 16).sum())


def count_launches(monkeypatch: pytest.MonkeyPatch, *kernels) -> Counter[str]:
    """Launches of each of these Triton kernels from here on, by kernel name."""
    launches: Counter[str] = Counter()
    for kernel in kernels:
        def counted(*args, _run=kernel.run, _name=kernel.__name__, **kw):
            launches[_name] += 1
            return _run(*args, **kw)

        monkeypatch.setattr(kernel, "run", counted)
    return launches


def check_row_set(logits: torch.Tensor, lengths: torch.Tensor, k: int, got: torch.Tensor) -> None:
    """Values equal torch.topk's over the visible columns; short rows 0..len-1 then exact -1 padding."""
    assert got.dtype == torch.int32 and got.shape == (logits.shape[0], k)
    for t in range(logits.shape[0]):
        n = int(lengths[t])
        row = got[t]
        valid = row[row >= 0]
        assert (row[len(valid) :] == -1).all(), "padding must be trailing -1"
        assert len(valid) == min(n, k)
        assert len(set(valid.tolist())) == len(valid), "an index is repeated"
        assert (valid < n).all()
        if n <= k:
            assert torch.equal(row[:n], torch.arange(n, dtype=torch.int32)), "short rows emit 0..len-1"
        expect = torch.topk(logits[t, :n], min(n, k)).values.sort().values
        assert torch.equal(logits[t, valid.long()].sort().values, expect)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [16, 64, 300])
def test_topk_matches_reference(gen, k, path):
    n = 700
    logits = torch.randn(6, n, generator=gen).clamp_min(0)  # ReLU logits: many exact ties at 0
    logits[1, : n // 2] = 1.5  # a row of equal values beyond k
    lengths = torch.tensor([n, n, k + 1, k, 3, 0], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, PATHS[path])
    ref = topk_indices(logits, lengths, k, backend="torch")
    check_row_set(logits, lengths, k, got)
    check_row_set(logits, lengths, k, ref)
    assert torch.equal(selected_values(logits, got), selected_values(logits, ref))


@pytest.mark.parametrize("path", PATHS)
def test_topk_large_k_and_negative_values(gen, path):
    k, n = 2048, 2600
    logits = torch.randn(2, n, generator=gen) * 1e3
    logits[1] = -logits[1].abs()  # all negative: the order-preserving key must flip them
    lengths = torch.tensor([n, 2100], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, PATHS[path])
    check_row_set(logits, lengths, k, got)


@pytest.mark.parametrize("path", PATHS)
def test_topk_extreme_values_ragged_rows(gen, path):
    k, n = 24, 200
    logits = torch.randn(7, n, generator=gen)
    logits[0, ::3] = float("-inf")
    logits[0, 5::7] = float("inf")
    logits[1, :] = -torch.finfo(torch.float32).max
    logits[1, 7:60:2] = torch.finfo(torch.float32).max  # 27 ties above k
    logits[2, :] = float("-inf")  # every key equal: the first k by position only need to be equal
    logits[3, 100:] = 1e30  # past the row's length: must never be picked
    logits[4, :150] = torch.where(torch.arange(150) % 2 == 0, 0.0, -0.0)  # a zero of each sign
    lengths = torch.tensor([n, 190, n, 100, 150, k, 0], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, PATHS[path])
    ref = topk_indices_torch(logits, lengths, k)
    check_row_set(logits, lengths, k, got)
    assert torch.equal(selected_values(logits, got), selected_values(logits, ref))
    assert torch.equal(got[5:], ref[5:]), "short rows are exact"


@pytest.mark.parametrize(("max_cols", "candidates", "sample", "expect"), [
    (40, 16, 0, {"_topk_in_registers_kernel": 1}),
    (39, 16, 0, {"_histogram_pass_kernel": 2, "_split_kernel": 1, "_finish_kernel": 1}),
    (39, 16, 16, {"_sample_kernel": 1, "_mark_kernel": 1, "_sampled_finish_kernel": 1}),
    (39, 8, 16, {"_histogram_pass_kernel": 2, "_split_kernel": 1, "_finish_kernel": 1})])  # 2 k > list
def test_topk_launches_by_column_count(gen, monkeypatch, max_cols, candidates, sample, expect):
    launches = count_launches(monkeypatch, in_registers._topk_in_registers_kernel, compacting._histogram_pass_kernel,
                              compacting._split_kernel, compacting._finish_kernel, sampled._sample_kernel,
                              sampled._mark_kernel, sampled._sampled_finish_kernel)
    logits = torch.randn(2, 40, generator=gen)
    lengths = torch.tensor([40, 9], dtype=torch.int32)
    got = topk_triton(logits, lengths, 8, replace(CPU_CONFIG, single_pass_max_cols=max_cols, candidates=candidates,
                                                   sample=sample))
    assert launches == expect
    check_row_set(logits, lengths, 8, got)


@pytest.mark.parametrize("path", PATHS)
def test_topk_nan_and_lengths_past_the_row(gen, path):
    """NaN ranks above +inf (torch.topk's order; every kernel's key); a length past the row's
    columns reads the row's columns alone."""
    k, n = 12, 90
    logits = torch.randn(3, n, generator=gen)
    logits[0, 3::10] = float("nan")  # 9 NaNs, then 3 more from +inf and the rest
    logits[0, 4::30] = float("inf")
    logits[1, 50:] = 5.0 + torch.arange(n - 50) / n  # the top k lie at the end of the row
    logits[2, :] = torch.randn(n, generator=gen).clamp_min(0)
    lengths = torch.tensor([n, n + 40, 1 << 30], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, PATHS[path])
    ref = topk_indices_torch(logits, lengths.clamp(max=n), k)
    torch.testing.assert_close(selected_values(logits, got), selected_values(logits, ref), rtol=0, atol=0,
                               equal_nan=True)
    assert set(got[1].tolist()) == set(range(n - k, n))
    check_row_set(logits[1:], torch.full((2,), n, dtype=torch.int32), k, got[1:])


@pytest.mark.parametrize("path", PATHS)
def test_topk_consecutive_floats(gen, path):
    """Rows of adjacent floats (every key in a range taken, shuffled), one across the two zeros: a
    search's pivots land on keys, so keys equal to a bound must fall on the right side of it."""
    k, n = 40, 300
    ramp = torch.arange(n // 2)
    # from 1.0 up; and +0.0 up and -0.0 down, through the denormals (the first pivot is +0.0's key)
    bits = torch.stack([0x3F800000 + torch.arange(n), torch.cat([ramp, ramp - (1 << 31)])]).to(torch.int32)
    logits = bits.view(torch.float32)[:, torch.randperm(n, generator=gen)].contiguous()
    lengths = torch.tensor([n, n - 7], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, PATHS[path])
    check_row_set(logits, lengths, k, got)


def search_rows(gen: torch.Generator, n: int) -> torch.Tensor:
    """Rows on which the in-register kernel's interpolation search guesses badly, 3 of each kind:
    the k-th largest value tied in a row spanning the key range (from -3e38 to 3e38, or from -inf
    to NaN), so the search narrows 2^32 keys down to one and the radius around the middle (the
    bisection fallback) bounds its steps; values crowded far below one outlier (guesses land
    near the crowd's edge, where the counts jump); adjacent floats under 2-8 outliers (keys on
    consecutive integers, where a step ends with k - 1 keys at or above the interval's end, and
    the largest key below that end, which the search then takes, is its neighbour); and two
    tight clusters far apart (a count that jumps from one to the other)."""
    tied = torch.round(torch.randn(6, n, generator=gen) * 4)
    tied[:3, :2] = torch.tensor([3e38, -3e38])
    tied[3:, :2] = torch.tensor([float("nan"), float("-inf")])
    crowded = torch.randn(3, n, generator=gen) * 1e-3
    crowded[:, 0] = 1e30
    adjacent = (0x3F800000 + torch.arange(n)).int().view(torch.float32).repeat(3, 1)
    # outliers after which a step ends on k - 1 keys: at k 24 in rows 0 and 1, at k 40 in row 2
    for row, outliers in enumerate((10.0 ** torch.arange(1, 3), 10.0 ** torch.arange(1, 4), 3e38 / torch.arange(1, 9))):
        adjacent[row, : len(outliers)] = outliers
    adjacent = adjacent[:, torch.randperm(n, generator=gen)]
    clusters = 1 + 1e-6 * torch.randn(3, n, generator=gen)
    clusters[:, ::2] -= 2
    return torch.cat([tied, crowded, adjacent, clusters])


@triton.jit
def _search_kernel(logits_ptr, out_ptr, length, k, BLOCK: tl.constexpr):
    """The in-register kernel's search alone on one row: out = (lo, top + 1, c_hi)."""
    col = tl.arange(0, BLOCK)
    valid = col < length
    key = tl.where(valid, ordered_key(tl.load(logits_ptr + col, mask=valid, other=0.0)), 0)
    lo, top, c_hi = in_registers.search_kth_key(key, valid, length, k)
    i = tl.arange(0, 4)
    tl.store(out_ptr + i, tl.where(i == 0, lo.to(tl.int64), tl.where(i == 1, top.to(tl.int64) + 1, c_hi.to(tl.int64))))


@pytest.mark.parametrize("k", [24, 40])
def test_topk_in_registers_search_ends_on_the_kth_key(gen, k):
    """What the search promises the emit, on the rows that defeat its guesses: c_hi < k keys at or
    above hi, and every key in [lo, hi) in the top k (exactly k at or above lo, or lo the k-th
    largest key and hi = lo + 1)."""
    n = 200
    for row in search_rows(gen, n):
        out = torch.zeros(4, dtype=torch.int64)
        _search_kernel[(1,)](row, out, n, k, BLOCK=256)
        lo, hi, c_hi = out[:3].tolist()
        keys = ordered_keys(row)
        kth = int(keys.topk(k).values[-1])
        assert int((keys >= hi).sum()) == c_hi < k
        assert lo <= kth < hi
        assert int((keys >= lo).sum()) == k or hi == lo + 1


def test_topk_in_registers_search_spans_every_key(gen):
    """A row holding the keys 0 and 2^32 - 1 (the NaNs whose bits are all ones, with and without the
    sign): the first interval is 2^32 - 1 keys wide, which fp32 rounds up to 2^32, and the pivot's
    cast back to 32 bits must stay in range for the search to move (and end)."""
    n, k = 200, 24
    row = torch.round(torch.randn(n, generator=gen) * 4)
    row[:2] = torch.tensor([-1, 0x7FFFFFFF], dtype=torch.int32).view(torch.float32)
    out = torch.zeros(4, dtype=torch.int64)
    _search_kernel[(1,)](row, out, n, k, BLOCK=256)
    lo, hi, c_hi = out[:3].tolist()
    keys = ordered_keys(row)
    assert int(keys.max()) == 0xFFFFFFFF and int(keys.min()) == 0
    kth = int(keys.topk(k).values[-1])
    assert int((keys >= hi).sum()) == c_hi < k and lo <= kth < hi


@pytest.mark.parametrize("k", [24, 40])
def test_topk_in_registers_search_worst_rows(gen, k):
    """The in-register kernel on rows that defeat its interpolation: values, -1 padding and the
    lengths as torch.topk's (NaN above +inf)."""
    n = 200
    logits = search_rows(gen, n)
    lengths = torch.full((logits.shape[0],), n, dtype=torch.int32)
    got = topk_triton(logits, lengths, k, PATHS["one launch in registers"])
    ref = topk_indices_torch(logits, lengths, k)
    assert ((got >= 0) & (got < n)).all() and all(len(set(row.tolist())) == k for row in got)
    torch.testing.assert_close(selected_values(logits, got), selected_values(logits, ref), rtol=0, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("cap", [48, 47])
def test_topk_compacting_candidates_fit_or_overflow(gen, cap):
    """Rows whose candidates fill the list exactly, or overflow it by one (the row fallback), with
    ties at the k-th largest value: the values stay torch.topk's."""
    k, n = 32, 300
    logits = torch.randn(4, n, generator=gen)
    logits[0, 10:58] = 2.0  # 48 equal values straddle the k-th largest
    logits[1, :] = torch.randn(n, generator=gen) * 1e-4 + 1.0  # values crowded into few 16-bit prefixes
    logits[2, 5:200:4] = float("inf")  # 49 ties above k: one prefix holds them all
    lengths = torch.tensor([n, n, 250, 120], dtype=torch.int32)
    counts = [candidate_count(logits[t, : int(lengths[t])], k) for t in range(3)]
    assert counts[0] == 48 and counts[1] > 48 and counts[2] == 49, counts  # the rows test what they claim
    got = topk_triton(logits, lengths, k, replace(CPU_CONFIG, single_pass_max_cols=0, candidates=cap))
    check_row_set(logits, lengths, k, got)
    ref = topk_indices_torch(logits, lengths, k)
    assert torch.equal(selected_values(logits, got), selected_values(logits, ref))


def test_topk_config_errors():
    with pytest.raises(ValueError, match="block=32768"):  # the split's packed scan would overflow
        replace(CPU_CONFIG, block=1 << 15)
    with pytest.raises(ValueError, match="candidates=0"):
        replace(CPU_CONFIG, candidates=0)
    with pytest.raises(ValueError, match="single_pass_max_cols"):  # the in-register kernel's packed scan
        replace(CPU_CONFIG, single_pass_max_cols=REGISTER_ROW_MAX_COLS + 1)
    with pytest.raises(ValueError, match="hist_block=-1"):
        replace(CPU_CONFIG, hist_block=-1)


def test_topk_fewer_columns_than_k(gen):
    logits = torch.randn(3, 10, generator=gen)
    lengths = torch.tensor([10, 4, 0], dtype=torch.int32)
    for backend in ("triton", "torch"):
        got = topk_indices(logits, lengths, 16, backend=backend)
        check_row_set(logits, lengths, 16, got)


def test_topk_errors():
    with pytest.raises(ValueError, match="fp32"):
        topk_indices(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="lengths"):
        topk_indices(torch.zeros(2, 4), torch.zeros(3, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="k=0"):
        topk_indices(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int32), 0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("block_size", [2, 61, 64])
def test_positions_to_slots(gen, block_size, backend):
    block_table = torch.randperm(12, generator=gen).int().reshape(3, 4)
    seq_ids = torch.tensor([2, 0, 2], dtype=torch.int32)
    idx = torch.randint(0, 4 * block_size, (3, 5), generator=gen).int()
    idx[1, 3:] = -1
    got = positions_to_slots(idx, block_table, seq_ids, block_size, backend=backend)
    for t in range(3):
        for j in range(5):
            p = int(idx[t, j])
            expect = -1 if p < 0 else int(block_table[seq_ids[t], p // block_size]) * block_size + p % block_size
            assert int(got[t, j]) == expect
    with pytest.raises(ValueError, match="beyond the block table"):
        positions_to_slots(idx * 0 + 4 * block_size, block_table, seq_ids, block_size, backend=backend)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_topk_default_config_by_shape(device):
    """Rows past the single launch take the sampled path in batches of more than
    SAMPLED_MIN_COLUMNS columns, else the compacting path, whose histogram levels step wider than
    its split past FINE_CHUNK_MAX_COLS."""
    dev = torch.device(device)
    wide = config.FINE_CHUNK_MAX_COLS + 1
    limit = config.SAMPLED_MIN_COLUMNS
    assert default_config(dev, wide, limit // wide + 1).sample == config.SAMPLE_COLS
    assert default_config(dev, config.SINGLE_PASS_MAX_COLS + 1, limit // (config.SINGLE_PASS_MAX_COLS + 1) + 1).sample
    few = default_config(dev, limit // 2, 2)  # exactly SAMPLED_MIN_COLUMNS columns
    assert not few.sample and few.candidates
    if device == "cuda":
        assert default_config(dev, wide, 1).hist_block > default_config(dev, wide, 1).block
        assert default_config(dev, config.FINE_CHUNK_MAX_COLS, 1).hist_block == 0


@pytest.mark.parametrize("path", ["reference", *PATHS])
def test_topk_rows_with_few_finite_values_stay_inside_their_length(gen, path):
    """Rows with fewer than k values above -inf inside their length, and large values past it: every
    selected column lies inside the length (the reference once ranked masked columns with -inf)."""
    k, n = 16, 120
    logits = torch.full((3, n), float("-inf"))
    logits[0, :5] = torch.randn(5, generator=gen)  # 5 finite values, 25 -inf inside the length
    logits[2, 7] = 3.0  # one finite value in a row one longer than k
    logits[:, 60:] = 1e30  # past every row's length
    lengths = torch.tensor([30, 40, 17], dtype=torch.int32)
    if path == "reference":
        got = topk_indices_torch(logits, lengths, k)
    else:
        got = topk_triton(logits, lengths, k, PATHS[path])
    check_row_set(logits, lengths, k, got)
    assert set(range(5)) <= set(got[0].tolist()) and 7 in got[2].tolist()


def slots_to_positions(slots: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor,
                       block_size: int) -> torch.Tensor:
    """The positions of slots of a block table whose blocks are all distinct: -1 stays -1."""
    column_of_block = torch.full((int(block_table.max()) + 1,), -1, dtype=torch.long)
    column_of_block[block_table.long()] = torch.arange(block_table.shape[1]).expand_as(block_table)
    block = slots.long().clamp_min(0) // block_size
    assert (block_table[seq_ids.long()[:, None], column_of_block[block]] == block)[slots >= 0].all(), \
        "a slot lies outside its request's blocks"
    return torch.where(slots >= 0, column_of_block[block] * block_size + slots % block_size, -1).int()


def slot_rows(gen: torch.Generator, block_size: int) -> tuple[torch.Tensor, torch.Tensor, SlotMap]:
    """ReLU'd rows (ties at 0), a row of ties beyond k, rows of lengths k + 1, k, 3, 0 and one past
    the columns, over 3 requests (one shared by two rows) whose blocks are shuffled."""
    n = 300
    logits = torch.randn(7, n, generator=gen).clamp_min(0)
    logits[1, : n // 2] = 1.5
    lengths = torch.tensor([n, n, 41, 40, 3, 0, 1 << 30], dtype=torch.int32)
    blocks = -(-n // block_size)
    block_table = torch.randperm(3 * blocks + 5, generator=gen)[: 3 * blocks].int().reshape(3, blocks)
    seq_ids = torch.tensor([2, 0, 1, 2, 0, 1, 1], dtype=torch.int32)
    return logits, lengths, SlotMap(block_table, seq_ids, block_size)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("block_size", [16, 7])
def test_topk_slots_match_the_composed_references(gen, path, block_size):
    """Every path's slots are its own positions mapped through the block table (exactly, in order),
    and map back to positions holding torch.topk's values; short rows and -1 padding exact."""
    k = 40
    logits, lengths, slots = slot_rows(gen, block_size)
    got = topk_triton(logits, lengths, k, PATHS[path], slots=slots)
    top = topk_triton(logits, lengths, k, PATHS[path])
    assert torch.equal(got, positions_to_slots_reference(top, slots.block_table, slots.seq_ids, block_size))
    assert not torch.equal(got, top), "the table must move the slots away from the positions"
    ref = topk_slots(logits, lengths, k, slots.block_table, slots.seq_ids, block_size, backend="torch")
    ref_top = topk_indices_torch(logits, lengths, k)
    assert torch.equal(ref, positions_to_slots_reference(ref_top, slots.block_table, slots.seq_ids, block_size))
    positions = slots_to_positions(got, slots.block_table, slots.seq_ids, block_size)
    visible = lengths.clamp(max=logits.shape[1])
    check_row_set(logits, visible, k, positions)
    assert torch.equal(selected_values(logits, positions), selected_values(logits, ref_top))
    assert torch.equal(got[3:6], ref[3:6]), "short rows are exact"


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_topk_slots_api(gen, backend):
    logits, lengths, slots = slot_rows(gen, 16)
    got = topk_slots(logits, lengths, 40, slots.block_table, slots.seq_ids, 16, backend=backend)
    if backend == "triton":
        expect = topk_triton(logits, lengths, 40, CPU_CONFIG, slots=slots)
    else:
        expect = positions_to_slots_reference(topk_indices_torch(logits, lengths, 40), slots.block_table,
                                              slots.seq_ids, 16)
    assert torch.equal(got, expect)
    with pytest.raises(ValueError, match="topk_slots: seq_ids"):
        topk_slots(logits, lengths, 40, slots.block_table, slots.seq_ids[:2], 16, backend=backend)
    with pytest.raises(ValueError, match="beyond the block table"):
        topk_slots(logits, lengths, 40, slots.block_table[:, :-1], slots.seq_ids, 16, backend=backend)
    with pytest.raises(ValueError, match="topk_slots: k=0"):
        topk_slots(logits, lengths, 0, slots.block_table, slots.seq_ids, 16, backend=backend)


def test_topk_slots_one_launch_in_registers(gen, monkeypatch):
    """The in-register path maps in its own write: one launch, no positions_to_slots kernel."""
    launches = count_launches(monkeypatch, in_registers._topk_in_registers_kernel,
                              slot_kernels._positions_to_slots_kernel)
    logits, lengths, slots = slot_rows(gen, 16)
    topk_triton(logits, lengths, 40, PATHS["one launch in registers"], slots=slots)
    assert launches == {"_topk_in_registers_kernel": 1}
    topk_triton(logits, lengths, 40, PATHS["compacting"], slots=slots)
    assert launches == {"_topk_in_registers_kernel": 1, "_positions_to_slots_kernel": 1}
    topk_triton(logits, lengths, 40, PATHS["sampled"], slots=slots)  # mapped in its finish
    assert launches == {"_topk_in_registers_kernel": 1, "_positions_to_slots_kernel": 1}


@triton.jit
def _sample_columns_kernel(out_ptr, length, SAMPLE: tl.constexpr):
    """The sampled path's sample columns of a row of `length` (-1 past the drawn ones)."""
    col, drawn, m = sampled._sample_columns(length, SAMPLE)
    tl.store(out_ptr + tl.arange(0, SAMPLE), tl.where(drawn, col, -1))


def sample_columns(length: int, sample: int) -> torch.Tensor:
    out = torch.empty(sample, dtype=torch.int32)
    _sample_columns_kernel[(1,)](out, length, SAMPLE=sample)
    return out[out >= 0]


@pytest.mark.parametrize(("length", "sample"), [(700, 128), (128, 128), (100, 128), (1000, 64), (8300, 128)])
def test_sampled_path_draws_one_column_per_window(length, sample):
    cols = sample_columns(length, sample)
    stride = -(-length // sample)
    assert len(cols) == -(-length // stride)
    assert torch.equal(cols // stride, torch.arange(len(cols))), "one column in each window"
    assert (cols < length).all()
    if stride > 2:
        assert len(set((cols % stride).tolist())) > 1, "the offsets in the windows vary"


def marked_counts(logits: torch.Tensor, lengths: torch.Tensor, k: int, cfg: TopkConfig) -> list[int]:
    """Per row, the columns the sampled path's mark pass finds at or above its sample's threshold."""
    t, n = logits.shape
    words = -(-n // 32)
    counts = torch.empty(t, 32, dtype=torch.int32)
    bits = torch.empty(t, words, dtype=torch.int32)
    sampled._sample_kernel[(t,)](logits, lengths, counts, n, k, SAMPLE=cfg.sample)
    sampled._mark_kernel[(t, 2)](logits, lengths, counts, bits, n, k, words, CHUNK=cfg.chunk, BLOCK=cfg.block)
    return counts[:, 0].tolist()


def test_sampled_rows_off_their_sample_finish_exactly(gen):
    """Rows with fewer marked columns than k (the sample holds the row's largest values and no
    other column comes near them) or more than the list holds (ties), which finish over the row
    itself, beside a row on the list: each row's top k in ascending column order, ties at the
    k-th value by lowest column."""
    n, k, sample = 700, 64, 128
    cfg = replace(CPU_CONFIG, single_pass_max_cols=0, candidates=512, sample=sample)
    logits = torch.rand(4, n, generator=gen)
    logits[0, sample_columns(n, sample).long()] += 10
    logits[1] = 1.0  # every column ties
    logits[2, 50:650] = 2.0  # 600 ties above the rest
    lengths = torch.full((4,), n, dtype=torch.int32)
    marked = marked_counts(logits, lengths, k, cfg)
    assert marked[0] < k and marked[1] == n and marked[2] == 600 and k <= marked[3] <= cfg.candidates, marked
    got = topk_triton(logits, lengths, k, cfg)
    # value descending, then column ascending: the first k, in column order
    expect = torch.sort(-logits, dim=1, stable=True).indices[:, :k].sort(dim=1).values.int()
    assert torch.equal(got, expect)
