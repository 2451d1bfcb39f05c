"""The fp8 indexer decode through a tensor descriptor (kernels/indexer_decode.py) in the interpreter:
against the paged reference at d_I 64 and 128, key blocks smaller than and equal to the cache
block, staggered contexts, the -inf tail and the unwritten one; the paged call's dispatch to it;
its descriptor made once per cache tensor and dropped with it."""

from __future__ import annotations

import gc

import pytest
import torch

import kernels.indexer_decode as indexer_decode
from kernels.indexer import indexer_logits_paged
from kernels.indexer_decode import DescriptorDecodeConfig, indexer_decode_descriptor, values_descriptor
from tests.kernels.checks import assert_logits_match
from tests.kernels.test_indexer import make_cache, make_inputs


def decode_batch(gen, d_i: int, block_size: int, heads: int = 4, requests: int = 3, max_blocks: int = 4):
    """One query token per request over shuffled cache blocks: contexts of almost all, one, and
    a block and a bit of their blocks."""
    cache = make_cache(gen, requests * max_blocks * block_size, d_i, "fp8", block_size)
    block_table = torch.randperm(requests * max_blocks, generator=gen).int().reshape(requests, max_blocks)
    lens = torch.tensor([max_blocks * block_size - 3, 1, block_size + 5], dtype=torch.int32)[:requests]
    q8, w = make_inputs(gen, requests, heads, d_i)
    return q8, w, cache, block_table, torch.arange(requests, dtype=torch.int32), lens


@pytest.mark.parametrize(("d_i", "block_size", "config"), [
    (64, 32, DescriptorDecodeConfig(block_n=16, programs_per_sm=2, num_stages=2)),
    (128, 16, DescriptorDecodeConfig(block_n=16, programs_per_sm=2)),
])
def test_descriptor_decode_matches_reference(gen, d_i, block_size, config):
    q8, w, cache, table, seq_ids, lens = decode_batch(gen, d_i, block_size)
    n_cols = table.shape[1] * block_size
    ref = indexer_logits_paged(q8, w, cache, "fp8", table, block_size, seq_ids, lens, n_cols, backend="torch")
    got = indexer_decode_descriptor(q8, w, cache, table, seq_ids, lens, block_size, n_cols, config)
    assert_logits_match(got, ref)
    unmasked = indexer_decode_descriptor(q8, w, cache, table, seq_ids, lens, block_size, n_cols, config,
                                         mask_tail=False)
    for t, n in enumerate(lens.tolist()):
        assert_logits_match(unmasked[t : t + 1, :n], ref[t : t + 1, :n])
    assert torch.isnan(unmasked[1, config.block_n :]).all(), "whole key blocks past the context are not touched"


@pytest.mark.parametrize("heads", [64, 16])
def test_paged_decode_takes_the_descriptor_path(gen, monkeypatch, heads):
    """A decode step of fp8 keys at 64 or 16 heads on a device with tensor memory copies (faked
    here: the interpreter runs the descriptor loads) goes through the descriptor kernel, with the
    reference's logits; MXFP4 keys and fewer heads do not."""
    calls = []

    def counted(*a, **k):
        calls.append(a[8])
        return indexer_decode_descriptor(*a, **k)

    monkeypatch.setattr(indexer_decode, "tensor_memory_copies", lambda device: True)
    import kernels.indexer as indexer

    monkeypatch.setattr(indexer, "indexer_decode_descriptor", counted)
    q8, w, cache, table, seq_ids, lens = decode_batch(gen, 64, 64, heads=heads, requests=2, max_blocks=2)
    args = (q8, w, cache, "fp8", table, 64, seq_ids, lens, 128)
    ref = indexer.indexer_logits_paged(*args, backend="torch")
    assert_logits_match(indexer.indexer_logits_paged(*args, backend="triton"), ref)
    assert calls == [DescriptorDecodeConfig()]
    assert indexer_decode.descriptor_decode_config("mxfp4", 64, 64, 64, q8.device) is None
    assert indexer_decode.descriptor_decode_config("fp8", 64, 64, 32, q8.device) is None  # block_n 64 > 32
    assert indexer_decode.descriptor_decode_config("fp8", 8, 64, 64, q8.device) is None  # below 16 heads


def test_descriptor_made_once_per_cache_and_dropped_with_it(gen):
    cache = make_cache(gen, 64, 64, "fp8", 16)
    first = values_descriptor(cache, 64, 16, 16)
    assert values_descriptor(cache, 64, 16, 16) is first
    assert first.shape == [4, 16, 64] and first.strides == [16 * 68, 64, 1] and first.block_shape == [1, 16, 64]
    count = len(indexer_decode._DESCRIPTORS)
    del cache, first
    gc.collect()
    assert len(indexer_decode._DESCRIPTORS) == count - 1


def test_block_must_divide_cache_block(gen):
    q8, w, cache, table, seq_ids, lens = decode_batch(gen, 64, 16)
    with pytest.raises(ValueError, match="block_n=32"):
        indexer_decode_descriptor(q8, w, cache, table, seq_ids, lens, 16, 64, DescriptorDecodeConfig(block_n=32))
