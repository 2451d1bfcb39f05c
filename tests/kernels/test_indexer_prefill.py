"""The fp8 indexer prefill through a tensor descriptor (kernels/indexer_prefill.py) in the interpreter:
against the paged reference with tiles inside one request and straddling requests, key blocks
smaller than and equal to the cache block, d_I 64 and 128, the -inf tail and the unwritten one; the
paged call's dispatch to it for prefill chunks of fp8 keys."""

from __future__ import annotations

import pytest
import torch

import kernels.indexer_decode as indexer_decode
from kernels.indexer import TILED_MIN_TOKENS_PER_REQUEST, indexer_logits_paged
from kernels.indexer_prefill import PrefillDescriptorConfig, indexer_prefill_descriptor, prefill_descriptor_config
from tests.kernels.checks import assert_logits_match
from tests.kernels.test_indexer import make_cache, make_inputs
from tests.kernels.test_indexer_tiled import paged_batch


@pytest.mark.parametrize(("d_i", "block_size", "config"), [
    (64, 16, PrefillDescriptorConfig(block_m=4, block_n=16, programs_per_sm=2, num_stages=2)),
    (64, 32, PrefillDescriptorConfig(block_m=2, block_n=16, programs_per_sm=2)),
    (128, 16, PrefillDescriptorConfig(block_m=4, block_n=16, programs_per_sm=2)),
])
def test_prefill_descriptor_matches_reference(gen, d_i, block_size, config):
    """Three requests back to back (a 9-token chunk at a 40-token offset, one decode token, a
    6-token chunk from 0): tiles of 4 tokens both stay inside and straddle requests."""
    q8, w, cache, table, seq_ids, lens = paged_batch(gen, "fp8", block_size, d_i)
    n_cols = table.shape[1] * block_size
    ref = indexer_logits_paged(q8, w, cache, "fp8", table, block_size, seq_ids, lens, n_cols, backend="torch")
    got = indexer_prefill_descriptor(q8, w, cache, table, seq_ids, lens, block_size, n_cols, config)
    assert_logits_match(got, ref)
    unmasked = indexer_prefill_descriptor(q8, w, cache, table, seq_ids, lens, block_size, n_cols, config,
                                          mask_tail=False)
    for t, n in enumerate(lens.tolist()):
        assert_logits_match(unmasked[t : t + 1, :n], ref[t : t + 1, :n])
    # the last tile (tokens of the 6-token chunk, contexts up to 6) reads one key block at most
    assert torch.isnan(unmasked[-1, config.block_n :]).all(), "whole key blocks past the context are not touched"


def test_paged_prefill_takes_the_descriptor_path(gen, monkeypatch):
    """A prefill chunk of fp8 keys on a device with tensor memory copies (faked here: the
    interpreter runs the descriptor loads) goes through the descriptor kernel, with the
    reference's logits; MXFP4 keys, and cache blocks the key block does not divide, do not."""
    import kernels.indexer as indexer
    import kernels.indexer_prefill as indexer_prefill

    calls = []

    def counted(*a, **k):
        calls.append(a[8])
        return indexer_prefill_descriptor(*a, **k)

    monkeypatch.setattr(indexer_decode, "tensor_memory_copies", lambda device: True)
    monkeypatch.setattr(indexer_prefill, "tensor_memory_copies", lambda device: True)
    monkeypatch.setattr(indexer, "indexer_prefill_descriptor", counted)
    n = TILED_MIN_TOKENS_PER_REQUEST + 2
    cache = make_cache(gen, 4 * 64, 64, "fp8", 64)
    q8, w = make_inputs(gen, n, 4, 64)
    seq_ids = torch.zeros(n, dtype=torch.int32)
    lens = torch.arange(150, 150 + n, dtype=torch.int32)
    table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    args = (q8, w, cache, "fp8", table, 64, seq_ids, lens, 256)
    got = indexer.indexer_logits_paged(*args, backend="triton")
    assert calls == [PrefillDescriptorConfig()]
    assert_logits_match(got, indexer.indexer_logits_paged(*args, backend="torch"))
    assert prefill_descriptor_config("mxfp4", 64, 64, 64, q8.device) is None
    assert prefill_descriptor_config("fp8", 64, 64, 32, q8.device) is None  # block_n 64 > 32


def test_block_must_divide_cache_block(gen):
    q8, w, cache, table, seq_ids, lens = paged_batch(gen, "fp8", 16)
    with pytest.raises(ValueError, match="block_n=32"):
        indexer_prefill_descriptor(q8, w, cache, table, seq_ids, lens, 16, 64, PrefillDescriptorConfig(block_n=32))
