"""Overlapped scheduling (server/engine/pending.py): the same tokens as scheduling one step at a time."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from server.engine.core import Engine
from server.engine.messages import AddRequest, SamplingParams
from server.engine.pending import fill_placeholders
from server.engine.sequence import placeholder
from tests.server.engine_fixtures import greedy, mixed_requests, overlapped_and_serial, prompt, run, tiny_config


def engines(**kw) -> tuple[Engine, Engine]:
    """(overlapped, one step at a time) engines of the same config."""
    return overlapped_and_serial(tiny_config(**kw))


@pytest.mark.parametrize("long_prefill_tokens", [0, None])
def test_same_tokens_and_reasons_with_chunks_prefix_hits_and_sampling(long_prefill_tokens):
    overlapped, serial = engines(max_num_batched_tokens=64, max_num_seqs=4, long_prefill_tokens=long_prefill_tokens)
    a, b = run(overlapped, mixed_requests()), run(serial, mixed_requests())
    assert a == b
    sa, sb = overlapped.stats(), serial.stats()
    assert (sa.prompt_tokens, sa.generation_tokens, sa.prefix_cache_hits) == \
           (sb.prompt_tokens, sb.generation_tokens, sb.prefix_cache_hits)
    if long_prefill_tokens == 0:  # first come, first served: shared_b waits for shared_a's blocks
        assert sa.prefix_cache_hits > 0


def test_same_tokens_under_preemption():
    overlapped, serial = engines(num_blocks=12, max_num_seqs=8, max_num_batched_tokens=64)
    reqs = {f"q{i}": (prompt(100 + i, 20 + 7 * i), greedy(10 + i)) for i in range(10)}
    assert run(overlapped, reqs) == run(serial, reqs)
    assert overlapped.stats().num_preemptions > 0


def test_eos_stop_finishes_one_step_late_without_an_extra_token():
    # The eos id is a token the model emits mid-way, so requests stop on it (and min_tokens holds it off).
    probe = run(Engine(tiny_config()), {"p": (prompt(9, 12), greedy(8))})
    eos = probe["p"]["tokens"][3]
    reqs = {"stop": (prompt(9, 12), SamplingParams(max_tokens=8, temperature=0.0)),
            "held": (prompt(9, 12), SamplingParams(max_tokens=8, temperature=0.0, min_tokens=6)),
            "other": (prompt(10, 30), greedy(8))}
    overlapped, serial = engines(eos_token_id=eos)
    a, b = run(overlapped, reqs), run(serial, reqs)
    assert a == b
    assert a["stop"]["finish_reason"] == "stop" and a["stop"]["tokens"][-1] == eos
    assert len(a["stop"]["tokens"]) <= 4


def test_length_finish_costs_no_extra_step():
    overlapped, serial = engines()
    counts = []
    for engine in (overlapped, serial):
        launched = 0
        execute = engine.runner.execute

        def counted(*args, _execute=execute):
            nonlocal launched
            launched += 1
            return _execute(*args)

        engine.runner.execute = counted
        run(engine, {"a": (prompt(11, 10), greedy(6))})
        counts.append(launched)
    assert counts[0] == counts[1] == 6


def test_tokens_arrive_one_step_later_and_placeholders_fill_on_the_device():
    engine = Engine(dataclasses.replace(tiny_config(), overlap_schedule="on"))
    engine.add_request(AddRequest("a", prompt(12, 10), greedy(3), 0.0))
    assert engine.step().outputs == ()  # prefill launched; its token is still pending
    seq = engine.seqs["a"]
    assert seq.token_ids[-1] == placeholder(0) and seq.num_pending_tokens == 1
    first = engine.step().outputs  # the decode launched, then the prefill's token read
    assert [o.new_token_ids for o in first] == [(seq.token_ids[10],)] and seq.num_pending_tokens == 1
    ids = torch.tensor([5, placeholder(1), 7, placeholder(0)])
    assert fill_placeholders(ids, torch.tensor([40, 41])).tolist() == [5, 41, 7, 40]


def test_abort_while_in_flight_reports_nothing_after_it():
    engine = Engine(tiny_config(max_num_batched_tokens=32, max_num_seqs=2))
    for i in range(3):
        engine.add_request(AddRequest(f"a{i}", prompt(20 + i, 40), greedy(20), 0.0))
    outputs = []
    for _ in range(4):
        outputs += engine.step().outputs
    engine.abort("a0")  # its decode is in flight
    for _ in range(3):
        out = engine.step().outputs
        engine.check_invariants()
        assert [o.finish_reason for o in out if o.request_id == "a0"] in ([], ["abort"])
        outputs += out
    after = [o for o in outputs if o.request_id == "a0"]
    assert after[-1].finish_reason == "abort" and after[-1].new_token_ids == ()
    while engine.has_unfinished():
        assert all(o.request_id != "a0" for o in engine.step().outputs)
    assert engine.blocks.num_in_use == 0
