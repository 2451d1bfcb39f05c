"""Sparse MLA: Triton kernel (with and without split-K) vs torch reference vs a float64 per-token loop."""

from __future__ import annotations

import sys

import pytest
import torch

from kernels import read_kv_rows, sparse_mla, write_kv_cache
from kernels.quant import kv_row_width
from kernels.sparse_mla import SparseMlaConfig, auto_num_splits, sparse_mla_triton
from tests.kernels.checks import assert_mla_match

D_C, D_R = 128, 32
SCALE = (32 + 32) ** -0.5  # (d_nope + d_rope)^-1/2 at the tiny shapes


def make_cache(gen, num_slots: int, kv_dtype: str, d_c: int = D_C, d_r: int = D_R) -> torch.Tensor:
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    cache = torch.zeros(num_slots, kv_row_width(d_c, d_r, kv_dtype), dtype=dtype)
    c = torch.randn(num_slots, d_c, generator=gen) * torch.rand(num_slots, 1, generator=gen) * 2
    write_kv_cache(cache, torch.arange(num_slots), c, torch.randn(num_slots, d_r, generator=gen), kv_dtype)
    return cache


def make_indices(gen, n_tokens: int, k: int, num_slots: int, valid_counts: list[int]) -> torch.Tensor:
    """Random slots, each token keeping valid_counts[t] of them (a context shorter than K), -1 after."""
    idx = torch.randint(0, num_slots, (n_tokens, k), generator=gen, dtype=torch.int32)
    for t, n in enumerate(valid_counts):
        idx[t, n:] = -1
    return idx


def independent(q, cache, idx, d_c, kv_dtype):
    """Float64 loop over tokens on the dequantised rows."""
    out = torch.zeros(q.shape[0], q.shape[1], d_c, dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    for t in range(q.shape[0]):
        sel = idx[t][idx[t] >= 0]
        if len(sel) == 0:
            continue
        rows = read_kv_rows(cache, sel, d_c, q.shape[2] - d_c, kv_dtype).double()
        logits = SCALE * q[t].double() @ rows.T
        lse[t] = torch.logsumexp(logits, dim=-1)
        out[t] = torch.softmax(logits, dim=-1) @ rows[:, :d_c]
    return out, lse


def run_both(q, cache, idx, kv_dtype, num_splits, d_c=D_C):
    got = sparse_mla(q, cache, idx, SCALE, d_c, kv_dtype, num_splits=num_splits, backend="triton")
    ref = sparse_mla(q, cache, idx, SCALE, d_c, kv_dtype, backend="torch")
    assert got[0].shape == ref[0].shape and got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32
    assert_mla_match(*got, *ref)
    out64, lse64 = independent(q, cache, idx, d_c, kv_dtype)
    assert_mla_match(got[0], got[1], out64.to(torch.bfloat16), lse64.float())
    return got


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_query_parts_read_where_they_are(gen, kv_dtype):
    """The model's call: the latent part alone and the rotary part a strided view of wider rows
    (the query projection's output), against the same query concatenated."""
    t, h, num_slots = 5, 4, 120
    cache = make_cache(gen, num_slots, kv_dtype)
    idx = torch.randint(0, num_slots, (t, 40), generator=gen, dtype=torch.int32)
    idx[1, 25:] = -1
    q = torch.randn(t, h, D_C + D_R, generator=gen).bfloat16()
    wide = torch.randn(t, h, 3 * D_R, generator=gen).bfloat16()
    wide[..., D_R:2 * D_R] = q[..., D_C:]
    q_rope = wide[..., D_R:2 * D_R]
    assert q_rope.stride() == (h * 3 * D_R, 3 * D_R, 1)
    for backend in ("triton", "torch"):
        got = sparse_mla(q[..., :D_C].contiguous(), cache, idx, SCALE, D_C, kv_dtype, backend=backend, q_rope=q_rope)
        assert_mla_match(*got, *sparse_mla(q, cache, idx, SCALE, D_C, kv_dtype, backend="torch"))
    for bad_q, bad_rope in ((q, q_rope), (q[..., :D_C], q_rope[:, 0])):  # q with its rope part; a 2-D q_rope
        with pytest.raises(ValueError, match="with q_rope"):
            sparse_mla(bad_q, cache, idx, SCALE, D_C, kv_dtype, q_rope=bad_rope)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("k,num_splits", [(16, None), (64, 3), (200, 1), (200, 4)])
def test_decode_matches(gen, kv_dtype, k, num_splits):
    num_slots = 300
    cache = make_cache(gen, num_slots, kv_dtype)
    # 1 query token with a full list, one whose context is shorter than K, one with nothing valid
    q = torch.randn(3, 16, D_C + D_R, generator=gen).bfloat16()
    idx = make_indices(gen, 3, k, num_slots, [k, max(1, k // 3), 0])
    out, lse = run_both(q, cache, idx, kv_dtype, num_splits)
    assert (out[2] == 0).all() and torch.isneginf(lse[2]).all(), "no valid index -> o = 0, lse = -inf"


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("preload_tiles,num_splits", [(0, 1), (1, 1), (2, 1), (2, 3), (8, 2)])
def test_preloaded_index_chunks(gen, kv_dtype, preload_tiles, num_splits):
    """Indices loaded preload_tiles blocks at a time ahead of their loop (several chunks per
    program, a last chunk cut short, splits) give the in-loop result; 0 loads them in the loop."""
    num_slots, k = 200, 90  # 6 blocks of 16, the last one partly past K
    cache = make_cache(gen, num_slots, kv_dtype)
    q = torch.randn(3, 16, D_C + D_R, generator=gen).bfloat16()
    idx = make_indices(gen, 3, k, num_slots, [k, 37, 0])
    cfg = SparseMlaConfig(16, 16, 4, 1, preload_tiles)
    got = sparse_mla_triton(q[..., :D_C], q[..., D_C:], cache, idx, SCALE, kv_dtype, num_splits, cfg)
    assert_mla_match(*got, *sparse_mla(q, cache, idx, SCALE, D_C, kv_dtype, backend="torch"))


def test_split_count_follows_programs_per_sm(monkeypatch):
    """The automatic split aims at cfg.programs_per_sm programs per SM, within the block count and
    the partials cap; a nearly full wave and the CPU are not split."""
    monkeypatch.setattr(sys.modules["kernels.sparse_mla"], "sm_count", lambda device: 132)
    gpu = torch.device("cuda")
    assert auto_num_splits(64, 2048, SparseMlaConfig(16, 32, 4, 3), gpu) == 8
    assert auto_num_splits(64, 2048, SparseMlaConfig(16, 32, 4, 3, programs_per_sm=2), gpu) == 4
    assert auto_num_splits(64, 64, SparseMlaConfig(16, 32, 4, 3), gpu) == 2  # two blocks of 32
    assert auto_num_splits(16, 2048, SparseMlaConfig(64, 64, 8, 2), gpu, partial_ratio=0.11) == 4
    assert auto_num_splits(100, 2048, SparseMlaConfig(16, 32, 4, 3), gpu) == 1
    assert auto_num_splits(64, 2048, SparseMlaConfig(16, 32, 4, 3), torch.device("cpu")) == 1


def test_speculative_verify_tokens_and_more_heads(gen):
    """k+1 = 4 query tokens of one request (growing index lists) and a second request; H = 64."""
    cache = make_cache(gen, 200, "fp8_ds_mla")
    q = torch.randn(5, 64, D_C + D_R, generator=gen).bfloat16()
    idx = make_indices(gen, 5, 32, 200, [29, 30, 31, 32, 7])
    run_both(q, cache, idx, "fp8_ds_mla", None)


def test_more_splits_than_index_blocks_and_odd_heads(gen):
    """Splits that get no index at all must drop out of the combine; H not a multiple of 16."""
    cache = make_cache(gen, 100, "bf16")
    q = torch.randn(2, 20, D_C + D_R, generator=gen).bfloat16()
    idx = make_indices(gen, 2, 16, 100, [16, 5])
    run_both(q, cache, idx, "bf16", 6)


def test_wider_rows_and_all_invalid_batch(gen):
    d_c, d_r = 256, 64
    cache = make_cache(gen, 64, "bf16", d_c, d_r)
    q = torch.randn(1, 16, d_c + d_r, generator=gen).bfloat16()
    run_both(q, cache, make_indices(gen, 1, 16, 64, [16]), "bf16", None, d_c)
    none_valid = torch.full((1, 16), -1, dtype=torch.int32)
    out, lse = sparse_mla(q, cache, none_valid, SCALE, d_c, "bf16", num_splits=2, backend="triton")
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_errors(gen):
    cache = make_cache(gen, 8, "bf16")
    q = torch.randn(1, 16, D_C + D_R, generator=gen).bfloat16()
    idx = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="bf16"):
        sparse_mla(q.float(), cache, idx, SCALE, D_C, "bf16")
    with pytest.raises(ValueError, match="kv_cache"):
        sparse_mla(q, cache, idx, SCALE, D_C, "fp8_ds_mla")
    with pytest.raises(ValueError, match="powers of two"):
        sparse_mla(q, cache, idx, SCALE, 96, "bf16")
    with pytest.raises(ValueError, match="indices"):
        sparse_mla(q, cache, idx[:, None], SCALE, D_C, "bf16")
    with pytest.raises(ValueError, match="num_splits"):
        sparse_mla(q, cache, idx, SCALE, D_C, "bf16", num_splits=0)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        sparse_mla(q, cache, idx, SCALE, D_C, "bf16", backend="cuda")

