"""Top-k indices: Triton radix select vs the torch reference vs torch.topk, compared on selected values."""

from __future__ import annotations

import pytest
import torch

from kernels import positions_to_slots, topk_indices
from tests.kernels.checks import selected_values


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


@pytest.mark.parametrize("k", [16, 64, 300])
def test_topk_matches_reference(gen, k):
    n = 700
    logits = torch.randn(6, n, generator=gen).clamp_min(0)  # ReLU logits: many exact ties at 0
    logits[1, : n // 2] = 1.5  # a row of equal values beyond k
    lengths = torch.tensor([n, n, k + 1, k, 3, 0], dtype=torch.int32)
    got = topk_indices(logits, lengths, k, backend="triton")
    ref = topk_indices(logits, lengths, k, backend="torch")
    check_row_set(logits, lengths, k, got)
    check_row_set(logits, lengths, k, ref)
    assert torch.equal(selected_values(logits, got), selected_values(logits, ref))


def test_topk_large_k_and_negative_values(gen):
    k, n = 2048, 2600
    logits = torch.randn(2, n, generator=gen) * 1e3
    logits[1] = -logits[1].abs()  # all negative: the order-preserving key must flip them
    lengths = torch.tensor([n, 2100], dtype=torch.int32)
    got = topk_indices(logits, lengths, k, backend="triton")
    check_row_set(logits, lengths, k, got)


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


@pytest.mark.parametrize("block_size", [2, 61, 64])
def test_positions_to_slots(gen, block_size):
    block_table = torch.randperm(12, generator=gen).int().reshape(3, 4)
    seq_ids = torch.tensor([2, 0, 2], dtype=torch.int32)
    idx = torch.randint(0, 4 * block_size, (3, 5), generator=gen).int()
    idx[1, 3:] = -1
    got = positions_to_slots(idx, block_table, seq_ids, block_size)
    for t in range(3):
        for j in range(5):
            p = int(idx[t, j])
            expect = -1 if p < 0 else int(block_table[seq_ids[t], p // block_size]) * block_size + p % block_size
            assert int(got[t, j]) == expect
    with pytest.raises(ValueError, match="beyond the block table"):
        positions_to_slots(idx * 0 + 4 * block_size, block_table, seq_ids, block_size)
