"""Shared helpers for the engine and model tests: tiny CPU configs and a run-to-completion driver."""

from __future__ import annotations

import dataclasses
import random

from server.config import CacheConfig, EngineConfig, SchedulerConfig, model_preset
from server.engine.core import Engine
from server.engine.messages import AddRequest, SamplingParams


def tiny_config(*, num_blocks: int | None = 256, block_size: int = 16, kv_cache_dtype: str = "bf16",
                indexer_key_dtype: str = "fp8", prefix_caching: bool = True, max_num_seqs: int = 16,
                max_num_batched_tokens: int = 512, max_model_len: int = 1024, backend: str = "torch",
                long_prefill_tokens: int | None = None,
                seed: int = 0, weights: str | None = None, **model_overrides) -> EngineConfig:
    model = dataclasses.replace(model_preset("tiny"), **model_overrides)
    return EngineConfig(
        model=model,
        cache=CacheConfig(block_size=block_size, kv_cache_dtype=kv_cache_dtype,
                          indexer_key_dtype=indexer_key_dtype, enable_prefix_caching=prefix_caching,
                          num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                  max_model_len=max_model_len, long_prefill_tokens=long_prefill_tokens),
        device="cpu", attention_backend=backend, seed=seed, weights=weights,
    )


def prompt(seed: int, n: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(256) for _ in range(n))


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def overlapped_and_serial(config: EngineConfig) -> tuple[Engine, Engine]:
    """(overlapped, one step at a time) engines of the same config (auto is off on CPU)."""
    overlapped = Engine(dataclasses.replace(config, overlap_schedule="on"))
    serial = Engine(dataclasses.replace(config, overlap_schedule="off"))
    assert overlapped.overlap and not serial.overlap
    return overlapped, serial


def mixed_requests() -> dict[str, tuple[tuple[int, ...], SamplingParams]]:
    """Requests that take every path of a step at a budget of 64 tokens and 4 sequences: chunked
    prefill, a prefix-cache hit (with --long-prefill-tokens 0), one- and two-token outputs, a seeded
    sampled request."""
    shared = prompt(7, 40)
    return {
        "short": (prompt(1, 3), greedy(9)),
        "long": (prompt(2, 150), greedy(23)),  # chunked over several steps at a budget of 64
        "shared_a": (shared + prompt(3, 5), greedy(7)),
        "shared_b": (shared + prompt(4, 9), greedy(11)),  # hits shared_a's blocks if admitted after them
        "one": (prompt(5, 20), greedy(1)),
        "two": (prompt(8, 20), greedy(2)),
        "seeded": (prompt(6, 30), SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=3)),
    }


def run(engine: Engine, requests: dict[str, tuple[tuple[int, ...], SamplingParams]],
        max_steps: int = 10_000) -> dict[str, dict]:
    """Add every request, step until all finish; per request: tokens, finish reason, cached tokens.
    Checks the block invariant after every step and that no request is lost or duplicated."""
    for rid, (ids, params) in requests.items():
        engine.add_request(AddRequest(rid, ids, params, 0.0))
    results: dict[str, dict] = {rid: {"tokens": [], "finish_reason": None} for rid in requests}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        out = engine.step()
        engine.check_invariants()
        for o in out.outputs:
            r = results[o.request_id]
            assert r["finish_reason"] is None, f"{o.request_id} produced output after finishing"
            r["tokens"].extend(o.new_token_ids)
            r["cached"] = o.num_cached_tokens
            r["prompt"] = o.num_prompt_tokens
            if o.finished:
                r["finish_reason"] = o.finish_reason
    assert not engine.has_unfinished(), "engine did not finish within max_steps"
    assert all(r["finish_reason"] for r in results.values()), "a request never finished"
    assert engine.blocks.num_in_use == 0
    return results


def tokens(results: dict[str, dict]) -> dict[str, list[int]]:
    return {rid: r["tokens"] for rid, r in results.items()}
