"""Engine core on the tiny model (CPU, torch kernels): batching, chunking, prefix caching,
preemption and abort keep greedy outputs identical and every block accounted for."""

from __future__ import annotations

import pickle

import pytest

from server.engine.core import Engine
from server.engine.messages import AddRequest, EngineStats, RequestOutput, SamplingParams, StepOutputs
from tests.server.engine_fixtures import greedy, prompt, run, tiny_config, tokens

LENGTHS = (5, 37, 64, 90, 130)


@pytest.fixture(scope="module")
def alone() -> dict[str, list[int]]:
    """Each request run by itself on a fresh engine without prefix caching."""
    out = {}
    for i, n in enumerate(LENGTHS):
        engine = Engine(tiny_config(prefix_caching=False))
        out.update(tokens(run(engine, {f"r{i}": (prompt(i, n), greedy(12))})))
    return out


def batch_requests():
    return {f"r{i}": (prompt(i, n), greedy(12)) for i, n in enumerate(LENGTHS)}


def test_batched_equals_alone(alone):
    engine = Engine(tiny_config(prefix_caching=False))
    assert tokens(run(engine, batch_requests())) == alone


def test_chunked_prefill_equals_whole(alone):
    # A 16-token budget splits every prompt into many chunks, interleaved with other decodes.
    engine = Engine(tiny_config(prefix_caching=False, max_num_batched_tokens=16))
    assert tokens(run(engine, batch_requests())) == alone


def test_prefix_cache_hit_same_output_and_reports_cached_tokens(alone):
    engine = Engine(tiny_config(prefix_caching=True))
    first = run(engine, {"r4": (prompt(4, 130), greedy(12))})
    assert first["r4"]["cached"] == 0
    # Same prompt again: 8 full blocks of 16 hit (the last token is always computed).
    again = run(engine, {"r4": (prompt(4, 130), greedy(12))})
    assert again["r4"]["tokens"] == alone["r4"]
    assert again["r4"]["cached"] == 128
    # A prompt that extends r3's prompt shares its full blocks.
    run(engine, {"r3": (prompt(3, 90), greedy(12))})
    longer = prompt(3, 90) + prompt(99, 20)
    ref = tokens(run(Engine(tiny_config(prefix_caching=False)), {"x": (longer, greedy(6))}))["x"]
    hit = run(engine, {"x": (longer, greedy(6))})
    assert hit["x"]["tokens"] == ref and hit["x"]["cached"] == 80
    stats = engine.stats()
    assert stats.prefix_cache_hits == 128 + 80
    assert stats.prefix_cache_queries == 130 * 2 + 90 + 110


def test_preemption_keeps_outputs_and_loses_nothing():
    # Prompts of exactly 3 blocks fill the 9-block pool; the first decode of each needs a 4th
    # block, so the newest running requests are preempted and later recomputed.
    reqs = {f"p{i}": (prompt(50 + i, 48), greedy(20)) for i in range(4)}
    ref = {}
    for rid, req in reqs.items():
        ref.update(tokens(run(Engine(tiny_config(prefix_caching=False)), {rid: req})))
    engine = Engine(tiny_config(num_blocks=9, prefix_caching=True))
    assert tokens(run(engine, reqs)) == ref
    assert engine.stats().num_preemptions > 0


def test_many_requests_tiny_pool_all_complete():
    engine = Engine(tiny_config(num_blocks=12, max_num_seqs=8, max_num_batched_tokens=64))
    reqs = {f"q{i}": (prompt(100 + i, 20 + 7 * i), greedy(10 + i)) for i in range(12)}
    results = run(engine, reqs)
    assert {rid: len(r["tokens"]) for rid, r in results.items()} == {f"q{i}": 10 + i for i in range(12)}
    assert all(r["finish_reason"] == "length" for r in results.values())
    assert engine.stats().num_preemptions > 0
    engine.check_invariants()


def test_abort_frees_every_block():
    engine = Engine(tiny_config(max_num_batched_tokens=32, max_num_seqs=2))
    for i in range(4):
        engine.add_request(AddRequest(f"a{i}", prompt(i, 70), greedy(50), 0.0))
    engine.step()  # a0 partly prefilled
    engine.abort("a0")  # mid-prefill
    outputs = []
    for _ in range(6):
        outputs += engine.step().outputs
    engine.abort("a1")  # mid-decode
    engine.abort("a3")  # still waiting
    engine.abort("missing")  # unknown ids are ignored
    engine.check_invariants()
    outputs += engine.step().outputs
    aborted = [o for o in outputs if o.finish_reason == "abort"]
    assert sorted(o.request_id for o in aborted) == ["a0", "a1", "a3"] and all(o.finished for o in aborted)
    engine.abort("a2")
    engine.step()
    assert not engine.has_unfinished()
    assert engine.blocks.num_in_use == 0 and engine.stats().kv_cache_usage == 0.0
    engine.check_invariants()


def test_stats_count_tokens():
    engine = Engine(tiny_config())
    run(engine, {"a": (prompt(1, 40), greedy(5)), "b": (prompt(2, 17), greedy(3))})
    s = engine.stats()
    assert (s.prompt_tokens, s.generation_tokens, s.num_running, s.num_waiting) == (57, 8, 0, 0)
    assert s.step_time_s > 0


@pytest.mark.parametrize("ids, params, match", [
    ((), greedy(4), "empty"),
    ((1, 2, 1024), greedy(4), "outside the vocabulary"),
    ((1, -1), greedy(4), "outside the vocabulary"),
    (tuple(range(200)) * 5, greedy(100), "exceeds the model's context length 1024"),
    ((1, 2), SamplingParams(max_tokens=0), "max_tokens"),
    ((1, 2), SamplingParams(max_tokens=3, min_tokens=4), "min_tokens"),
    ((1, 2), SamplingParams(max_tokens=3, top_p=0.0), "top_p"),
    ((1, 2), SamplingParams(max_tokens=3, temperature=-1.0), "temperature"),
])
def test_add_request_rejects_bad_input(ids, params, match):
    engine = Engine(tiny_config())
    with pytest.raises(ValueError, match=match):
        engine.add_request(AddRequest("bad", ids, params, 0.0))
    assert not engine.has_unfinished()


def test_add_request_rejects_duplicate_and_oversized_for_pool():
    engine = Engine(tiny_config(num_blocks=4))
    engine.add_request(AddRequest("x", (1, 2, 3), greedy(2), 0.0))
    with pytest.raises(ValueError, match="already"):
        engine.add_request(AddRequest("x", (1, 2, 3), greedy(2), 0.0))
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request(AddRequest("y", tuple(range(60)), greedy(10), 0.0))


def test_engine_attributes():
    engine = Engine(tiny_config())
    assert (engine.model_name, engine.vocab_size, engine.eos_token_id, engine.max_model_len, engine.num_gpus) == (
        "tiny", 1024, 257, 1024, 0)


def test_step_outputs_pickle_with_every_field():
    """Request outputs cross the pipe pickled as their field values (RequestOutput.__reduce__):
    every field, in order, survives."""
    out = RequestOutput("r", (1, 2), True, "stop", num_prompt_tokens=3, num_cached_tokens=4, num_draft_tokens=5,
                        num_accepted_tokens=6, error="why", num_drafts=7)
    step = StepOutputs((out, RequestOutput("s", (), False)), EngineStats(num_running=2, step_time_s=0.5))
    back = pickle.loads(pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == step and back.outputs[0].num_drafts == 7 and back.outputs[0].error == "why"
