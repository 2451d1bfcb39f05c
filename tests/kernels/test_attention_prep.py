"""The attention preparation kernels (kernels/attention_prep.py) against the separate torch ops, in the
Triton interpreter: rotations, norms, quantised bytes at the right cache slots, and nothing else touched."""

from __future__ import annotations

import pytest
import torch

from kernels.attention_prep import indexer_prepare, mla_prepare_
from kernels.quant import (
    decode_e4m3,
    gather_indexer_rows,
    indexer_row_bytes,
    kv_row_width,
    read_indexer_keys,
    read_kv_rows,
)

T, HEADS, SLOTS = 3, 20, 9  # 20 heads: the query spans two programs' head blocks, the second partly masked
INDEXER_BLOCK = 3  # keys per indexer cache block: the slots lie in blocks 2, 0 and 1
SLOT_IDS = torch.tensor([7, 0, 4])


def angles(gen: torch.Generator, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.rand(T, 1, half, generator=gen) * 6.0
    return a.cos(), a.sin()


def poisoned_cache(width: int, dtype: torch.dtype) -> torch.Tensor:
    """A cache whose rows are a known pattern: rows not written must come back unchanged."""
    if dtype == torch.uint8:
        return (torch.arange(SLOTS * width) % 251).to(torch.uint8).reshape(SLOTS, width)
    return torch.full((SLOTS, width), -3.0, dtype=dtype)


def assert_other_rows_kept(got: torch.Tensor, before: torch.Tensor) -> None:
    others = torch.ones(SLOTS, dtype=torch.bool)
    others[SLOT_IDS] = False
    assert torch.equal(got[others], before[others])


def assert_close_values(got: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    """Values of quantised rows: a bf16 rounding that fell the other way may move one element of a
    row by one step of the format, so the bar is relative to the row's largest value."""
    assert not torch.isnan(got).any()
    scale = ref.abs().amax(dim=-1, keepdim=True).clamp(min=1e-6)
    assert ((got - ref).abs() / scale).max() <= rel
    assert (got == ref).float().mean() > 0.95


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # fp32: a CPU model over a bf16 cache
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_mla_prepare_matches_separate_ops(gen, kv_dtype, dtype):
    d_c, d_r = 128, 16
    # latent and k_pe are views of one wider projection row, q_pe of wider head rows, as in the model
    kv = torch.randn(T, d_c + d_r + 8, generator=gen).to(dtype)
    q = torch.randn(T, HEADS, 24 + d_r, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(d_c, generator=gen)).to(dtype)
    cos, sin = angles(gen, d_r // 2)
    width = kv_row_width(d_c, d_r, kv_dtype)
    before = poisoned_cache(width, torch.bfloat16 if kv_dtype == "bf16" else torch.uint8)
    results = {}
    for backend in ("triton", "torch"):
        cache, q_b, kv_b = before.clone(), q.clone(), kv.clone()
        mla_prepare_(q_b[..., 24:], kv_b[:, :d_c], kv_b[:, d_c:d_c + d_r], weight, 1e-6, cos, sin, cache, SLOT_IDS,
                     kv_dtype, backend=backend)
        assert_other_rows_kept(cache, before)
        assert torch.equal(q_b[..., :24], q[..., :24])  # only the rotary part of the heads moves
        results[backend] = q_b, read_kv_rows(cache, SLOT_IDS, d_c, d_r, kv_dtype)
    (q_got, rows_got), (q_ref, rows_ref) = results["triton"], results["torch"]
    torch.testing.assert_close(q_got.float(), q_ref.float(), rtol=2e-2, atol=2e-2)
    assert_close_values(rows_got, rows_ref, rel=0.07 if kv_dtype == "fp8_ds_mla" else 0.01)


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
def test_indexer_prepare_matches_separate_ops(gen, key_dtype):
    d, rope_dim = 64, 32
    q = torch.randn(T, HEADS * d + 16, generator=gen).to(torch.bfloat16)[:, 16:].view(T, HEADS, d)
    key = torch.randn(T, d + 8, generator=gen).to(torch.bfloat16)[:, :d]
    head_weights = torch.randn(T, HEADS + 4, generator=gen).to(torch.bfloat16)[:, 4:]
    norm = torch.nn.LayerNorm(d, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(d, generator=gen))
        norm.bias.copy_(0.1 * torch.randn(d, generator=gen))
    cos, sin = angles(gen, rope_dim // 2)
    row = indexer_row_bytes(d, key_dtype)
    # the cache's layout: blocks of INDEXER_BLOCK keys, each block's values then its scale words
    before = poisoned_cache(row, torch.uint8).reshape(SLOTS // INDEXER_BLOCK, INDEXER_BLOCK * row)
    written = torch.zeros(before.numel(), dtype=torch.bool)
    written[indexer_byte_addresses(SLOT_IDS, d, key_dtype)] = True
    results = {}
    for backend in ("triton", "torch"):
        cache = before.clone()
        q8, weights = indexer_prepare(q, key, head_weights, norm.weight, norm.bias, norm.eps, cos, sin, rope_dim,
                                      cache, SLOT_IDS, key_dtype, 0.125, backend=backend)
        assert torch.equal(cache.view(-1)[~written], before.view(-1)[~written]), "other keys' bytes must stay"
        values, scale = read_indexer_keys(gather_indexer_rows(cache, SLOT_IDS, d, key_dtype), d, key_dtype)
        # what enters a logit: each head's e4m3 query times its weight, each key times its scale
        results[backend] = decode_e4m3(q8) * weights[..., None], values * scale[:, None]
    (q_got, k_got), (q_ref, k_ref) = results["triton"], results["torch"]
    assert_close_values(q_got, q_ref, rel=0.07)
    assert_close_values(k_got, k_ref, rel=0.07 if key_dtype == "fp8" else 0.2)


def indexer_byte_addresses(slots: torch.Tensor, d: int, key_dtype: str) -> torch.Tensor:
    """The bytes a key at each slot owns in a cache of INDEXER_BLOCK-key blocks, worked out here from
    the layout (values, then scale words, per block), not by the package's gather."""
    value_bytes = d if key_dtype == "fp8" else d // 2
    block, offset = slots // INDEXER_BLOCK, slots % INDEXER_BLOCK
    base = block * INDEXER_BLOCK * (value_bytes + 4)
    values = base[:, None] + offset[:, None] * value_bytes + torch.arange(value_bytes)
    scale = (base + INDEXER_BLOCK * value_bytes + 4 * offset)[:, None] + torch.arange(4)
    return torch.cat([values, scale], dim=1).reshape(-1)


def test_bad_shapes_are_named(gen):
    q = torch.zeros(T, HEADS, 64, dtype=torch.bfloat16)
    cache = torch.zeros(SLOTS, indexer_row_bytes(64, "fp8"), dtype=torch.uint8)
    norm = torch.nn.LayerNorm(64).to(torch.bfloat16)
    cos, sin = angles(gen, 16)
    with pytest.raises(ValueError, match="head_weights"):
        indexer_prepare(q, q[:, 0], q[:, :3, 0], norm.weight, norm.bias, norm.eps, cos, sin, 32, cache, SLOT_IDS,
                        "fp8", 1.0, backend="triton")
    with pytest.raises(ValueError, match=r"idx_cache: expected a contiguous uint8\[num_blocks, block_size \* 68\]"):
        indexer_prepare(q, q[:, 0], q[..., 0].contiguous(), norm.weight, norm.bias, norm.eps, cos, sin, 32,
                        cache[:, 1:], SLOT_IDS, "fp8", 1.0, backend="triton")
    kv = torch.zeros(SLOTS, kv_row_width(128, 16, "bf16"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache must be"):
        mla_prepare_(q[..., :16], torch.zeros(T, 128, dtype=torch.bfloat16), torch.zeros(T, 16, dtype=torch.bfloat16),
                     torch.ones(128), 1e-6, cos[..., :8], sin[..., :8], kv[:, 1:], SLOT_IDS, "bf16", backend="triton")
