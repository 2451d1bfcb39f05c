"""Overlapped scheduling of speculative steps (synthetic acceptance): the same tokens, finish
reasons and acceptance statistics as running one step at a time while the budget leaves every
request its drafts (a request stopped by EOS holds its place one step longer, so under a tight
budget or cache another request may verify, and accept, fewer drafts), with the step's emitted
tokens and next drafts as placeholders until they are read one step later."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from server.config import SpeculativeConfig
from server.engine.core import Engine
from server.engine.messages import AddRequest, SamplingParams
from server.engine.pending import fill_placeholders
from server.engine.sequence import placeholder, placeholder_bank, placeholder_row
from tests.server.engine_fixtures import greedy, mixed_requests, overlapped_and_serial, prompt, run, tiny_config

EOS = 257


def engines(k: int = 3, al: float = 2.5, **kw) -> tuple[Engine, Engine]:
    """(overlapped, one step at a time) engines with synthetic acceptance at (k, al)."""
    return overlapped_and_serial(dataclasses.replace(tiny_config(**kw), speculative=SpeculativeConfig(
        "mtp", k, "synthetic", synthetic_acceptance_length=al)))


def spec_stats(engine: Engine) -> tuple:
    s = engine.stats()
    return (s.prompt_tokens, s.generation_tokens, s.spec_num_drafts, s.spec_num_draft_tokens,
            s.spec_num_accepted_tokens, s.spec_accepted_per_position)


@pytest.mark.parametrize("long_prefill_tokens", [0, None])
def test_same_tokens_reasons_and_acceptance_with_chunks_and_prefix_hits(long_prefill_tokens):
    overlapped, serial = engines(max_num_batched_tokens=64, max_num_seqs=4, long_prefill_tokens=long_prefill_tokens)
    a, b = run(overlapped, mixed_requests()), run(serial, mixed_requests())
    assert a == b
    assert spec_stats(overlapped) == spec_stats(serial)
    assert overlapped.stats().spec_num_accepted_tokens > 0
    assert overlapped.stats().prefix_cache_hits == serial.stats().prefix_cache_hits
    if long_prefill_tokens == 0:  # first come, first served: shared_b waits for shared_a's blocks
        assert serial.stats().prefix_cache_hits > 0


def test_every_request_completes_under_preemption():
    # A preempted request loses its drafts, so where preemption strikes changes its tokens, and an
    # overlapped step frees a finished request's blocks a step later than a serial one: the
    # tokens may differ, but every request ends whole, and the blocks balance after every step (run).
    overlapped, serial = engines(num_blocks=14, max_num_seqs=8, max_num_batched_tokens=64)
    reqs = {f"q{i}": (prompt(100 + i, 20 + 7 * i), greedy(10 + 3 * i)) for i in range(10)}
    a, b = run(overlapped, reqs), run(serial, reqs)
    assert {rid: (len(r["tokens"]), r["finish_reason"]) for rid, r in a.items()} == \
           {rid: (len(r["tokens"]), r["finish_reason"]) for rid, r in b.items()} == \
           {rid: (p.max_tokens, "length") for rid, (_, p) in reqs.items()}
    assert overlapped.stats().num_preemptions > 0


def test_all_drafts_accepted_ends_exactly_at_max_tokens_and_the_context():
    overlapped, serial = engines(k=5, al=6.0, max_model_len=64)
    reqs = {f"m{n}": (prompt(n, 10), greedy(n)) for n in (1, 2, 3, 5, 6, 7, 12, 13)}
    reqs["ctx"] = (prompt(0, 50), greedy(14))
    a = run(overlapped, reqs)
    assert a == run(serial, reqs)
    assert {rid: len(r["tokens"]) for rid, r in a.items()} == {rid: p.max_tokens for rid, (_, p) in reqs.items()}
    assert all(r["finish_reason"] == "length" for r in a.values())


def test_eos_from_the_target_and_inside_accepted_drafts():
    # The eos id is a token the target emits mid-way; then a draft head that prefers it puts it
    # inside accepted drafts, where min_tokens must still hold it off.
    probe = run(Engine(tiny_config()), {"p": (prompt(9, 12), greedy(8))})
    eos = probe["p"]["tokens"][3]
    reqs = {"stop": (prompt(9, 12), SamplingParams(max_tokens=16, temperature=0.0)),
            "held": (prompt(9, 12), SamplingParams(max_tokens=16, temperature=0.0, min_tokens=6)),
            "other": (prompt(10, 30), greedy(16))}
    overlapped, serial = engines(eos_token_id=eos)
    assert run(overlapped, reqs) == run(serial, reqs)

    overlapped, serial = engines(k=3, al=4.0)
    for engine in (overlapped, serial):
        forward = engine.spec.draft.forward

        def eos_first(hidden, token_ids, target, backend=None, _forward=forward):
            hidden, logits = _forward(hidden, token_ids, target, backend)
            logits[:, EOS] = logits.max() + 1.0
            return hidden, logits

        engine.spec.draft.forward = eos_first
    reqs = {"r": (prompt(5, 12), SamplingParams(max_tokens=20, temperature=0.0, min_tokens=6)),
            "s": (prompt(6, 12), SamplingParams(max_tokens=20, temperature=0.0)),
            "go": (prompt(7, 12), greedy(20))}
    a = run(overlapped, reqs)
    assert a == run(serial, reqs)
    assert EOS not in a["r"]["tokens"][:6] and (a["r"]["tokens"][6:], a["r"]["finish_reason"]) == ([EOS], "stop")
    assert a["s"]["tokens"][-1] == EOS and a["s"]["finish_reason"] == "stop"
    assert len(a["go"]["tokens"]) == 20


def test_emitted_tokens_and_drafts_are_placeholders_until_the_next_step():
    overlapped, _ = engines(k=3, al=4.0)  # every draft accepted
    overlapped.add_request(AddRequest("r", prompt(1, 20), greedy(30), 0.0))
    assert overlapped.step().outputs == ()  # the prefill: its token is still on its way
    seq = overlapped.scheduler.running[0]
    assert seq.token_ids[-1] == placeholder(0, 0) and seq.num_pending_tokens == 1
    assert seq.draft_token_ids == [placeholder(1 + i, 0) for i in range(3)]
    [out] = overlapped.step().outputs  # verifies the drafts in bank 0, launched as bank 1
    assert len(out.new_token_ids) == 1 and min(out.new_token_ids) >= 0
    # the accepted drafts (now values) and the new step's token (bank 1) follow the first token
    assert seq.token_ids[20:24] == [out.new_token_ids[0]] + [t for t in seq.token_ids[21:24] if t >= 0]
    assert placeholder_bank(seq.token_ids[-1]) == 1 and placeholder_row(seq.token_ids[-1]) == 0
    assert [placeholder_bank(t) for t in seq.draft_token_ids] == [1, 1, 1]
    [out] = overlapped.step().outputs
    assert len(out.new_token_ids) == 4  # three accepted drafts and the target's token


def test_placeholders_of_either_bank_fill_from_their_row():
    ids = torch.tensor([5, placeholder(1, 1), 7, placeholder(0, 1), placeholder(2, 0)])
    assert fill_placeholders(ids, torch.tensor([40, 41, 42])).tolist() == [5, 41, 7, 40, 42]
    assert placeholder_row(placeholder(5, 1)) == 5 and placeholder_bank(placeholder(5, 1)) == 1


def test_abort_while_in_flight_reports_nothing_after_it_and_frees_every_block():
    overlapped, _ = engines(max_num_seqs=4)
    for i in range(3):
        overlapped.add_request(AddRequest(f"r{i}", prompt(i, 30), greedy(60), 0.0))
    for _ in range(4):
        overlapped.step()
    overlapped.abort("r1")
    seen = []
    while overlapped.has_unfinished():
        seen.extend(overlapped.step().outputs)
        overlapped.check_invariants()
    r1 = [o for o in seen if o.request_id == "r1"]
    assert [(o.new_token_ids, o.finish_reason) for o in r1] == [((), "abort")]
    assert overlapped.blocks.num_in_use == 0
    assert not overlapped.spec._acceptance
