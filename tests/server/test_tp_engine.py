"""Tensor parallelism on CPU (gloo, 2 ranks): the sharded engine computes what the unsharded one
does. Logits agree to 1e-3 (the row-parallel sums add in another order, so a bf16 or fp8 cache
row can round the other way) and greedy tokens are equal, over batched prefill chunks, multi-token queries,
decodes, prefix-cache hits, both KV cache layouts and both indexer key formats, speculative decoding (the
draft head runs on rank 0 alone), and with weights loaded from a file."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator

import pytest
import torch

from server.config import EngineConfig, ParallelConfig, SpeculativeConfig
from server.engine.core import Engine
from server.engine.model_runner import ModelRunner
from server.model.model import save_weights
from tests.server.engine_fixtures import greedy, prompt, run, tiny_config, tokens
from tests.server.test_model import CHUNKS, feed, token_lists

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

DTYPES = [("bf16", "fp8"), ("fp8", "mxfp4")]


def with_tp(config: EngineConfig, size: int = 2) -> EngineConfig:
    return dataclasses.replace(config, parallel=ParallelConfig(tensor_parallel_size=size))


@contextlib.contextmanager
def tp_runner(config: EngineConfig) -> Iterator[ModelRunner]:
    runner = ModelRunner(with_tp(config))
    try:
        yield runner
    finally:
        runner.close()


@contextlib.contextmanager
def tp_engine(config: EngineConfig) -> Iterator[Engine]:
    engine = Engine(with_tp(config))
    try:
        yield engine
    finally:
        engine.runner.close()


@pytest.mark.parametrize("kv_dtype,key_dtype", DTYPES)
def test_sharded_logits_match_unsharded(kv_dtype, key_dtype):
    """Every token's logits through ragged batches: prefill chunks, a multi-token query (the
    shape of speculative verification) and single-token decodes."""
    config = tiny_config(num_blocks=16, kv_cache_dtype=kv_dtype, indexer_key_dtype=key_dtype)
    lists = token_lists()
    expected = feed(ModelRunner(config), lists, CHUNKS)[0]
    with tp_runner(config) as runner:
        assert runner.model.layers[0].attn.num_heads == config.model.num_heads // 2
        assert runner.model.lm_head.weight.shape[0] == config.model.vocab_size // 2
        got = feed(runner, lists, CHUNKS)[0]
    for rid in expected:
        a, b = expected[rid], got[rid]
        assert a.shape == b.shape == (sum(CHUNKS[rid]), config.model.vocab_size)
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("kv_dtype,key_dtype", DTYPES)
def test_sharded_engine_greedy_tokens_equal_unsharded(kv_dtype, key_dtype):
    """Batched requests with chunked prefill (a 48-token budget), then requests that share the
    first ones' prefix and hit the prefix cache."""
    config = tiny_config(kv_cache_dtype=kv_dtype, indexer_key_dtype=key_dtype, max_num_batched_tokens=48,
                         max_num_seqs=4)
    shared = prompt(99, 64)
    first = {f"a{i}": (prompt(i, 10 + 29 * i), greedy(12)) for i in range(5)}
    first["p"] = (shared + prompt(7, 5), greedy(6))
    second = {f"b{i}": (shared + prompt(50 + i, 3 + i), greedy(8)) for i in range(3)}
    base = Engine(config)
    want_first, want_second = run(base, first), run(base, second)
    with tp_engine(config) as engine:
        assert engine.runner.num_gpus == 0  # CPU ranks are not GPUs
        got_first, got_second = run(engine, first), run(engine, second)
    assert tokens(got_first) == tokens(want_first)
    assert tokens(got_second) == tokens(want_second)
    assert all(r["cached"] == 64 for r in got_second.values())
    assert [r["cached"] for r in got_second.values()] == [r["cached"] for r in want_second.values()]


def test_sharded_engine_with_speculative_decoding_equals_unsharded():
    """Drafts from rank 0's draft head, verified k+1 positions at a time across both ranks."""
    config = dataclasses.replace(tiny_config(max_num_seqs=4), speculative=SpeculativeConfig("mtp", 3, "standard"))
    requests = {f"s{i}": (prompt(20 + i, 15 + 23 * i), greedy(10)) for i in range(4)}
    want = run(Engine(config), requests)
    with tp_engine(config) as engine:
        got = run(engine, requests)
        assert engine.stats().spec_num_drafts > 0
    assert tokens(got) == tokens(want)


def test_sharded_engine_loads_a_weights_file(tmp_path):
    """--weights: each rank slices the whole-model file; a seed-1 model loading seed-0 weights
    computes the seed-0 model. A shard cannot be saved as a whole model."""
    path = str(tmp_path / "tiny.safetensors")
    source = ModelRunner(tiny_config(seed=0, num_blocks=16))
    save_weights(source.model, path)
    lists = token_lists()
    expected = feed(source, lists, CHUNKS)[0]
    with tp_runner(tiny_config(seed=1, num_blocks=16, weights=path)) as runner:
        got = feed(runner, lists, CHUNKS)[0]
        with pytest.raises(ValueError, match="save at --tp 1"):
            save_weights(runner.model, str(tmp_path / "shard.safetensors"))
    for rid in expected:
        torch.testing.assert_close(got[rid], expected[rid], rtol=1e-3, atol=1e-3)


def test_bad_weights_file_is_refused_before_any_rank_starts(tmp_path, capfd, caplog):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    caplog.set_level(logging.INFO, logger="server")  # a started rank is logged at INFO
    with pytest.raises(ValueError, match="cannot read safetensors"):
        ModelRunner(with_tp(tiny_config(num_blocks=4, weights=str(junk))))
    assert "tensor-parallel rank 1 started" not in capfd.readouterr().err + caplog.text
