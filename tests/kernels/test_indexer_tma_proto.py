"""The tensor-descriptor indexer decode prototype (benchmarks/indexer_tma_proto.py) against the paged
reference in the interpreter: both key formats, d_I 64 and 128, key blocks smaller than and equal to
the cache block, scales by plain or descriptor loads, MXFP4 as group dots or one scaled dot,
staggered contexts and the -inf tail."""

from __future__ import annotations

import pytest
import torch

from benchmarks.indexer_tma_proto import TmaConfig, indexer_decode_tma, split_key_cache
from kernels.indexer import indexer_logits_paged
from tests.kernels.checks import assert_logits_match
from tests.kernels.test_indexer import make_cache, make_inputs


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
@pytest.mark.parametrize(("d_i", "block_size", "config"), [
    (64, 32, TmaConfig(block_n=16, programs_per_sm=2, num_stages=2)),
    (128, 16, TmaConfig(block_n=16, programs_per_sm=2, scales_tma=True)),
    (64, 32, TmaConfig(block_n=32, programs_per_sm=2, dot_scaled=True)),
    (128, 16, TmaConfig(block_n=16, programs_per_sm=2, dot_scaled=True)),
])
def test_tma_decode_matches_reference(gen, key_dtype, d_i, block_size, config):
    requests, max_blocks, heads = 3, 4, 4
    cache = make_cache(gen, requests * max_blocks * block_size, d_i, key_dtype)
    values, scales = split_key_cache(cache, key_dtype, d_i)
    block_table = torch.randperm(requests * max_blocks, generator=gen).int().reshape(requests, max_blocks)
    seq_ids = torch.arange(requests, dtype=torch.int32)
    lens = torch.tensor([max_blocks * block_size - 3, 1, block_size + 5], dtype=torch.int32)
    n_cols = max_blocks * block_size
    q8, w = make_inputs(gen, requests, heads, d_i)
    ref = indexer_logits_paged(q8, w, cache, key_dtype, block_table, block_size, seq_ids, lens, n_cols,
                               backend="torch")
    got = indexer_decode_tma(q8, w, values, scales, key_dtype, block_table, seq_ids, lens, block_size, n_cols, config)
    assert_logits_match(got, ref)


def test_split_rejects_rows_of_another_format(gen):
    cache = make_cache(gen, 4, 64, "fp8")
    with pytest.raises(ValueError, match="mxfp4"):
        split_key_cache(cache, "mxfp4", 64)


def test_block_must_divide_cache_block(gen):
    cache = make_cache(gen, 48, 64, "fp8")
    values, scales = split_key_cache(cache, "fp8", 64)
    q8, w = make_inputs(gen, 1, 4, 64)
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="block_n=32"):
        indexer_decode_tma(q8, w, values, scales, "fp8", torch.zeros(1, 1, dtype=torch.int32), one, one + 1, 48, 48,
                           TmaConfig(block_n=32))
