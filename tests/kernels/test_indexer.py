"""Indexer logits: Triton kernel vs torch reference vs an independent per-token fp32 computation."""

from __future__ import annotations

import pytest
import torch

from kernels import indexer_logits_paged, indexer_logits_ragged, indexer_row_bytes, write_indexer_cache
from kernels.quant import fp8_e4m3_quantize, gather_indexer_rows
from tests.kernels.checks import assert_logits_match

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def independent_keys(rows: torch.Tensor, d_i: int, key_dtype: str) -> torch.Tensor:
    """Dequantise key rows with torch's float8 type and a lookup table (not the package's decoder)."""
    if key_dtype == "fp8":
        scale = rows[:, d_i:].contiguous().view(torch.float32)
        return rows[:, :d_i].contiguous().view(torch.float8_e4m3fn).double() * scale.double()
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    packed = rows[:, : d_i // 2].long()
    codes = torch.stack([packed % 16, packed // 16], dim=-1).reshape(len(rows), d_i)
    scale = torch.pow(2.0, rows[:, d_i // 2 : d_i // 2 + d_i // 32].double() - 127)
    return table[codes] * scale.repeat_interleave(32, dim=1)


def independent_logits(q8, w, keys: torch.Tensor, visible: list[range]) -> torch.Tensor:
    """Per token loop in float64: sum_h w * relu(q . k) over the visible columns, -inf elsewhere."""
    q = q8.view(torch.float8_e4m3fn).double()
    out = torch.full((q.shape[0], keys.shape[0]), float("-inf"), dtype=torch.float64)
    for t, cols in enumerate(visible):
        sel = list(cols)
        if sel:
            out[t, sel] = (torch.relu(q[t] @ keys[sel].T) * w[t].double()[:, None]).sum(0)
    return out


def make_inputs(gen, n_tokens: int, heads: int, d_i: int):
    q8, qs = fp8_e4m3_quantize(torch.randn(n_tokens, heads, d_i, generator=gen))
    weights = torch.randn(n_tokens, heads, generator=gen) * qs * (heads * d_i) ** -0.5
    return q8, weights


def make_cache(gen, num_slots: int, d_i: int, key_dtype: str, block_size: int = 1) -> torch.Tensor:
    """An indexer key cache of blocks of block_size keys (1: key rows, the ragged layout) holding at
    least num_slots random keys (whole blocks)."""
    num_slots = -(-num_slots // block_size) * block_size
    cache = torch.zeros(num_slots // block_size, block_size * indexer_row_bytes(d_i, key_dtype), dtype=torch.uint8)
    keys = torch.randn(num_slots, d_i, generator=gen) * torch.rand(num_slots, 1, generator=gen) * 4
    write_indexer_cache(cache, torch.arange(num_slots), keys, key_dtype)
    return cache


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
@pytest.mark.parametrize("block_size", [2, 61, 64])
def test_paged_matches_reference_and_independent(gen, key_dtype, block_size):
    d_i, heads, max_blocks = 64, 4, 3
    n_req = 3
    cache = make_cache(gen, n_req * max_blocks * block_size + 5, d_i, key_dtype, block_size)
    # each request gets its own shuffled blocks
    block_table = torch.randperm(n_req * max_blocks, generator=gen).int().reshape(n_req, max_blocks)
    cap = max_blocks * block_size
    # request 0: one token with an empty context; request 1: one token; request 2: k+1 = 3 tokens
    seq_ids = torch.tensor([0, 1, 2, 2, 2], dtype=torch.int32)
    full = min(cap, 130)
    context_lens = torch.tensor([0, 1, full - 2, full - 1, full], dtype=torch.int32)
    max_context = full + 3
    q8, w = make_inputs(gen, len(seq_ids), heads, d_i)
    args = (q8, w, cache, key_dtype, block_table, block_size, seq_ids, context_lens, max_context)
    got = indexer_logits_paged(*args, backend="triton")
    ref = indexer_logits_paged(*args, backend="torch")
    assert got.shape == (5, max_context) and got.dtype == torch.float32
    assert_logits_match(got, ref)
    assert torch.isneginf(got[0]).all(), "an empty context scores nothing"
    pos = torch.arange(max_context)
    blocks = block_table[seq_ids.long()][:, (pos // block_size).clamp(max=max_blocks - 1)].long()
    slots = blocks * block_size + pos % block_size
    for t in range(len(seq_ids)):
        keys = independent_keys(gather_indexer_rows(cache, slots[t], d_i, key_dtype), d_i, key_dtype)
        indep = independent_logits(q8[t : t + 1], w[t : t + 1], keys, [range(int(context_lens[t]))])
        assert_logits_match(got[t : t + 1].double(), indep)


def test_paged_larger_dims_and_heads(gen):
    d_i, heads, block_size = 128, 16, 64
    cache = make_cache(gen, 256, d_i, "fp8", block_size)
    block_table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    seq_ids = torch.tensor([1, 0], dtype=torch.int32)
    context_lens = torch.tensor([128, 77], dtype=torch.int32)
    q8, w = make_inputs(gen, 2, heads, d_i)
    args = (q8, w, cache, "fp8", block_table, block_size, seq_ids, context_lens, 128)
    got = indexer_logits_paged(*args, backend="triton")
    ref = indexer_logits_paged(*args, backend="torch")
    assert_logits_match(got, ref)


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
def test_ragged_windows(gen, key_dtype):
    d_i, heads, n_keys = 64, 4, 70
    keys = make_cache(gen, n_keys, d_i, key_dtype)
    # a ragged prefill batch: two requests' keys back to back, causal windows, plus an empty window
    k_start = torch.tensor([0, 0, 0, 30, 30, 5], dtype=torch.int32)
    k_end = torch.tensor([1, 17, 30, 31, 70, 5], dtype=torch.int32)
    q8, w = make_inputs(gen, len(k_start), heads, d_i)
    got = indexer_logits_ragged(q8, w, keys, key_dtype, k_start, k_end, backend="triton")
    ref = indexer_logits_ragged(q8, w, keys, key_dtype, k_start, k_end, backend="torch")
    assert got.shape == (6, n_keys)
    assert_logits_match(got, ref)
    ranges = [range(int(a), int(b)) for a, b in zip(k_start, k_end)]
    indep = independent_logits(q8, w, independent_keys(keys, d_i, key_dtype), ranges)
    assert_logits_match(got.double(), indep)
    assert torch.isneginf(got[5]).all()


def test_zero_tokens_and_errors(gen):
    cache = make_cache(gen, 8, 64, "fp8")
    q8, w = make_inputs(gen, 0, 4, 64)
    empty = torch.zeros(0, dtype=torch.int32)
    assert indexer_logits_ragged(q8, w, cache, "fp8", empty, empty, backend="triton").shape == (0, 8)
    q8, w = make_inputs(gen, 1, 4, 64)
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="key rows"):
        indexer_logits_ragged(q8, w, cache, "mxfp4", one * 0, one, backend="triton")
    with pytest.raises(ValueError, match="weights"):
        indexer_logits_ragged(q8, w[:, :2], cache, "fp8", one * 0, one, backend="triton")
    paged = make_cache(gen, 8, 64, "fp8", 4)
    with pytest.raises(ValueError, match="exceeds"):
        indexer_logits_paged(q8, w, paged, "fp8", torch.zeros(1, 1, dtype=torch.int32), 4, one * 0, one * 5, 8,
                             backend="torch")
    with pytest.raises(ValueError, match=r"key cache must be uint8\[num_blocks, 544\].*block_size 8"):
        indexer_logits_paged(q8, w, paged, "fp8", torch.zeros(1, 1, dtype=torch.int32), 8, one * 0, one, 8)


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
def test_paged_unmasked_tail_scores_only_the_context(gen, key_dtype):
    """mask_tail=False (the engine's call): columns below context_lens match the reference; the
    kernel does no work past them, so they are left as they were (poisoned here)."""
    d_i, heads, block_size, max_blocks = 64, 4, 16, 6
    cache = make_cache(gen, 2 * max_blocks * block_size, d_i, key_dtype, block_size)
    block_table = torch.randperm(2 * max_blocks, generator=gen).int().reshape(2, max_blocks)
    seq_ids = torch.tensor([0, 1, 1], dtype=torch.int32)
    context_lens = torch.tensor([5, 40, 90], dtype=torch.int32)
    q8, w = make_inputs(gen, 3, heads, d_i)
    args = (q8, w, cache, key_dtype, block_table, block_size, seq_ids, context_lens, max_blocks * block_size)
    got = indexer_logits_paged(*args, backend="triton", mask_tail=False)
    ref = indexer_logits_paged(*args, backend="torch")
    for t, n in enumerate(context_lens.tolist()):
        assert_logits_match(got[t : t + 1, :n], ref[t : t + 1, :n])
    assert torch.isnan(got[0, 64:]).all(), "whole blocks past the context are not touched"
