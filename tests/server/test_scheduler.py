"""Scheduler: decode first, chunked prefill under the token budget, a long prefill's share while
others wait, max_num_seqs, preemption by recompute, stop conditions; driven by a deterministic
token source instead of a model."""

from __future__ import annotations

import random

from server.config import SchedulerConfig
from server.engine.kv_cache import BlockManager
from server.engine.messages import SamplingParams
from server.engine.scheduler import Scheduler
from server.engine.sequence import Sequence, SequenceStatus

EOS = 257


def next_token(s: Sequence) -> int:
    """A deterministic function of the whole context, like greedy decoding of a fixed model."""
    return (sum(s.token_ids) * 31 + len(s)) % 250


def run_step(sched: Scheduler) -> list[Sequence]:
    batch = sched.schedule()
    sampled = [next_token(s) if s.num_computed_tokens + n == len(s) else None
               for s, n in zip(batch.seqs, batch.num_new_tokens)]
    return sched.postprocess(batch, sampled)


def make(num_blocks=64, block_size=4, max_seqs=8, budget=32, max_len=256, caching=True, long_prefill=None):
    bm = BlockManager(num_blocks, block_size, caching)
    return Scheduler(SchedulerConfig(max_seqs, budget, long_prefill_tokens=long_prefill), bm, EOS, max_len), bm


def req(rid, n, max_tokens=5, **kw):
    rng = random.Random(rid)
    return Sequence(rid, [rng.randrange(250) for _ in range(n)], SamplingParams(max_tokens=max_tokens, **kw), 0.0)


def drain(sched, limit=10_000):
    done = []
    for _ in range(limit):
        if not sched.has_unfinished():
            return done
        done += run_step(sched)
    raise AssertionError("scheduler did not finish")


def reference_output(rid, n, max_tokens):
    s = req(rid, n, max_tokens)
    while s.num_output_tokens < max_tokens:
        s.token_ids.append(next_token(s))
    return s.output_token_ids


def test_decode_first_and_chunked_prefill():
    sched, bm = make(budget=16)
    a = req("a", 6)
    sched.add(a)
    run_step(sched)  # a prefilled whole, now decoding
    b = req("b", 40)
    sched.add(b)
    batch = sched.schedule()
    assert batch.seqs == (a, b) and batch.num_new_tokens == (1, 15)
    sched.postprocess(batch, [next_token(a), None])
    assert b.num_computed_tokens == 15 and b.num_output_tokens == 0
    done = drain(sched)
    assert {s.request_id for s in done} == {"a", "b"}
    assert b.output_token_ids == reference_output("b", 40, 5)
    bm.check_invariants([])


def step_with(sched, ids):
    """Schedule one step; {request id: tokens scheduled}; account it."""
    batch = sched.schedule()
    sched.postprocess(batch, [next_token(s) if s.num_computed_tokens + n == len(s) else None
                              for s, n in zip(batch.seqs, batch.num_new_tokens)])
    got = {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}
    return [got.get(i, 0) for i in ids]


def test_a_long_prefill_takes_its_share_and_then_what_the_short_prompts_leave():
    sched, bm = make(num_blocks=128, budget=32)  # the default share: 32 // 8 = 4 tokens
    long = req("long", 200)
    sched.add(long)
    assert step_with(sched, ["long"]) == [32]  # no one waits: the whole budget
    shorts = [req(f"s{i}", 6) for i in range(3)]
    for s in shorts:
        sched.add(s)
    # its share (4), the three short prompts (18), then the rest (10) to the long prompt again
    assert step_with(sched, ["long", "s0", "s1", "s2"]) == [14, 6, 6, 6]
    assert step_with(sched, ["long", "s0", "s1", "s2"]) == [29, 1, 1, 1]  # the short ones decode
    done = drain(sched)
    assert {s.request_id for s in done} == {"long", "s0", "s1", "s2"}
    assert long.output_token_ids == reference_output("long", 200, 5)
    assert all(s.output_token_ids == reference_output(s.request_id, 6, 5) for s in shorts)
    bm.check_invariants([])


def test_without_a_share_a_long_prefill_holds_up_the_requests_behind_it():
    sched, _ = make(num_blocks=128, budget=32, long_prefill=0)
    sched.add(req("long", 200))
    step_with(sched, ["long"])
    for i in range(3):
        sched.add(req(f"s{i}", 6))
    assert step_with(sched, ["long", "s0", "s1", "s2"]) == [32, 0, 0, 0]


def test_the_budget_left_goes_to_the_shortest_remaining_prefill_first():
    sched, bm = make(num_blocks=128, max_seqs=2, budget=32, long_prefill=4)
    a, b = req("a", 100), req("b", 60)
    sched.add(a)
    sched.add(b)
    assert step_with(sched, ["a", "b"]) == [32, 0]  # a admitted with the whole budget; b waits
    assert step_with(sched, ["a", "b"]) == [4, 28]  # b waits: a's share, then b admitted
    sched.add(req("c", 5))  # waits: max_num_seqs is reached
    # both shares (4 each), then the 24 left to b, 28 to go against a's 60
    assert step_with(sched, ["a", "b", "c"]) == [4, 28, 0]
    assert step_with(sched, ["a", "b", "c"]) == [28, 4, 0]  # b's last 4, the rest to a
    drain(sched)
    assert a.output_token_ids == reference_output("a", 100, 5)
    bm.check_invariants([])


def test_max_num_seqs_limits_running():
    sched, bm = make(max_seqs=2, budget=64)
    for i in range(5):
        sched.add(req(f"r{i}", 5))
    batch = sched.schedule()
    assert len(batch.seqs) == 2 and len(sched.waiting) == 3
    sched.postprocess(batch, [next_token(s) for s in batch.seqs])
    drain(sched)
    bm.check_invariants([])


def test_preemption_completes_every_request_exactly_once():
    # 12 blocks of 4 tokens: not enough for 6 requests of 10 + 8 tokens at once.
    sched, bm = make(num_blocks=12, block_size=4, max_seqs=6, budget=64)
    specs = {f"r{i}": 7 + i % 4 for i in range(6)}
    for rid, n in specs.items():
        sched.add(req(rid, n, max_tokens=8))
    seen = []
    for _ in range(1000):
        if not sched.has_unfinished():
            break
        seen += run_step(sched)
        bm.check_invariants(sched.running)
        assert len(sched.running) + len(sched.waiting) + len(seen) == len(specs)
    assert sched.num_preemptions > 0
    assert sorted(s.request_id for s in seen) == sorted(specs)
    for s in seen:
        assert s.output_token_ids == reference_output(s.request_id, specs[s.request_id], 8)
        assert s.finish_reason == "length"
    bm.check_invariants([])


def test_prefix_hit_counted_once_and_reported():
    sched, bm = make(block_size=4)
    a = req("a", 13, max_tokens=1)
    sched.add(a)
    drain(sched)
    b = Sequence("b", a.token_ids[:13], SamplingParams(max_tokens=1), 0.0)
    sched.add(b)
    drain(sched)
    assert b.num_cached_tokens == 12
    assert sched.prefix_queries == 26 and sched.prefix_hits == 12
    assert b.output_token_ids == a.output_token_ids
    bm.check_invariants([])


def test_stop_conditions():
    sched, bm = make()
    # eos is produced by a forced token source below
    s1 = req("eos", 4, max_tokens=10)
    s2 = req("ignore", 4, max_tokens=3, ignore_eos=True)
    s3 = req("min", 4, max_tokens=10, min_tokens=2)
    for s in (s1, s2, s3):
        sched.add(s)
    for _ in range(3):
        batch = sched.schedule()
        sched.postprocess(batch, [EOS] * len(batch.seqs))
    assert s1.finish_reason == "stop" and s1.output_token_ids == [EOS]
    assert s2.finish_reason == "length" and s2.output_token_ids == [EOS] * 3
    assert s3.finish_reason == "stop" and s3.num_output_tokens == 3
    bm.check_invariants([])


def test_finish_while_waiting_or_running_frees_blocks():
    sched, bm = make(max_seqs=1)
    a, b = req("a", 9), req("b", 9)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.finish(a, "abort")
    sched.finish(b, "abort")
    assert a.status is SequenceStatus.FINISHED and not sched.has_unfinished()
    bm.check_invariants([])


def test_random_adds_aborts_and_steps_keep_every_invariant():
    """A seeded random mix of arrivals (many sharing prefixes), aborts and steps on a small pool:
    the budget is never exceeded, blocks always balance, and every request either finishes with
    the output it would have had alone or was aborted."""
    rng = random.Random(7)
    sched, bm = make(num_blocks=24, block_size=4, max_seqs=5, budget=24)
    shared = [rng.randrange(250) for _ in range(12)]
    live: dict[str, Sequence] = {}
    done: dict[str, Sequence] = {}
    aborted = set()
    for i in range(400):
        r = rng.random()
        if r < 0.15 and len(live) + len(done) + len(aborted) < 60:
            rid = f"q{i}"
            head = shared[: rng.choice((0, 4, 8, 12))]
            ids = head + [rng.randrange(250) for _ in range(rng.randrange(1, 20))]
            seq = Sequence(rid, ids, SamplingParams(max_tokens=rng.randrange(1, 12)), 0.0)
            live[rid] = seq
            sched.add(seq)
        elif r < 0.2 and live:
            rid = rng.choice(sorted(live))
            sched.finish(live.pop(rid), "abort")
            aborted.add(rid)
        else:
            batch = sched.schedule()
            assert batch.num_tokens <= 24 and len(sched.running) <= 5
            sampled = [next_token(s) if s.num_computed_tokens + n == len(s) else None
                       for s, n in zip(batch.seqs, batch.num_new_tokens)]
            for seq in sched.postprocess(batch, sampled):
                done[seq.request_id] = live.pop(seq.request_id)
        bm.check_invariants(sched.running)
        assert len(sched.running) + len(sched.waiting) == len(live)
    drain(sched)
    for rid, seq in list(live.items()):
        done[rid] = seq
    assert len(done) + len(aborted) >= 40
    for seq in done.values():
        ref = Sequence("ref", seq.token_ids[: seq.num_prompt_tokens], seq.params, 0.0)
        while ref.num_output_tokens < seq.params.max_tokens:
            ref.token_ids.append(next_token(ref))
        assert seq.output_token_ids == ref.output_token_ids and seq.finish_reason == "length"
    assert sched.prefix_hits > 0 and sched.num_preemptions > 0
    bm.check_invariants([])
