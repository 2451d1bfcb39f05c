"""Prompt synthesis: exact lengths, exact shared prefixes, salts, vocabulary range, determinism."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from traces import PromptSynth, Request, load_traces

ROOT = Path(__file__).resolve().parents[2]


def _request(index: int, input_tokens: int, hash_ids: tuple[int, ...]) -> Request:
    return Request(index=index, t=0.0, input_tokens=input_tokens, output_tokens=1, hash_ids=hash_ids, think_time=0.0)


def _blocks(prompt: np.ndarray, count: int, block_size: int) -> list[bytes]:
    return [prompt[i * block_size:(i + 1) * block_size].tobytes() for i in range(count)]


def test_exact_length_and_dtype() -> None:
    synth = PromptSynth(block_size=16)
    for input_tokens, ids in ((0, ()), (5, ()), (16, (3,)), (47, (3, 4)), (150_000, tuple(range(9000)))):
        prompt = synth.prompt("s", _request(0, input_tokens, ids), salt=0)
        assert prompt.dtype == np.int32 and prompt.shape == (input_tokens,)
        assert not prompt.flags.writeable  # the cache holds a view of it


def test_shared_leading_ids_share_exactly_that_prefix() -> None:
    synth = PromptSynth(block_size=8)
    a = synth.prompt("s", _request(0, 30, (1, 2, 3)), salt=7)
    b = synth.prompt("s", _request(1, 40, (1, 2, 9, 4)), salt=7)
    assert np.array_equal(a[:16], b[:16])
    assert not np.array_equal(a[16:24], b[16:24])
    assert a[16] != b[16]
    # Same ids, different request: the block prefix is shared, the tail is the request's own.
    c = synth.prompt("s", _request(2, 30, (1, 2, 3)), salt=7)
    assert np.array_equal(a[:24], c[:24]) and not np.array_equal(a[24:], c[24:])
    # Another session's block 1 is another block: hash ids are local to a trace.
    d = synth.prompt("other", _request(0, 30, (1, 2, 3)), salt=7)
    assert set(_blocks(a, 3, 8)).isdisjoint(_blocks(d, 3, 8))


def test_a_different_salt_shares_no_block() -> None:
    session = load_traces("agentic-coding").sessions[0]
    synth = PromptSynth(block_size=session.block_size)
    seen: dict[int, set[bytes]] = {0: set(), 1: set()}
    for request in list(session.all_requests())[:20]:
        for salt in seen:
            prompt = synth.prompt(session.id, request, salt)
            seen[salt].update(_blocks(prompt, len(request.hash_ids), session.block_size))
            tail = prompt[len(request.hash_ids) * session.block_size:]
            if tail.size:
                seen[salt].add(b"tail" + tail.tobytes())
    assert len(seen[0]) > 1000 and seen[0].isdisjoint(seen[1])


def test_vocabulary_range() -> None:
    synth = PromptSynth(block_size=32, vocab_size=50, vocab_offset=1000)
    prompt = synth.prompt("s", _request(0, 20_000, tuple(range(300))), salt=3)
    assert prompt.min() == 1000 and prompt.max() == 1049
    counts = np.bincount(prompt - 1000, minlength=50)
    assert counts.min() > 0.8 * counts.mean()


def test_cache_never_changes_the_tokens() -> None:
    session = next(s for s in load_traces("agentic-coding").sessions if s.subagents)
    cached = PromptSynth(block_size=64, cache_tokens=400_000)
    uncached = PromptSynth(block_size=64, cache_tokens=0)
    requests = list(session.all_requests())
    for salt in (0, 5, 0):
        for request in requests[:40]:
            assert np.array_equal(cached.prompt(session.id, request, salt), uncached.prompt(session.id, request, salt))


def test_a_prefix_of_the_cached_prompt_is_served_from_it_unchanged() -> None:
    """Requests that shrink back to a prefix of the cached prompt (with and without a tail), grow
    again, and diverge: the tokens are those of an uncached synthesiser, and a prompt served as a
    view of the cache is read-only like any other."""
    cached, uncached = PromptSynth(block_size=4), PromptSynth(block_size=4, cache_tokens=0)
    plan = [(0, 28, (1, 2, 3, 4, 5, 6, 7)), (1, 16, (1, 2, 3, 4)), (2, 18, (1, 2, 3, 4)), (3, 20, (1, 2, 3, 4, 5)),
            (4, 28, (1, 2, 3, 4, 5, 6, 7)), (5, 32, (1, 2, 3, 4, 5, 6, 7, 8)), (6, 12, (1, 2, 9)), (7, 0, ()),
            (8, 8, (1, 2))]
    for salt in (3, 3, 4):
        for index, tokens, ids in plan:
            got = cached.prompt("s", _request(index, tokens, ids), salt)
            assert not got.flags.writeable and got.dtype == np.int32
            assert np.array_equal(got, uncached.prompt("s", _request(index, tokens, ids), salt))


def test_no_caller_can_change_the_cache() -> None:
    """A returned prompt's writeable flag cannot be set back (its base is read-only), and hash ids
    given as a list compare with the cached tuple's."""
    cached, uncached = PromptSynth(block_size=4), PromptSynth(block_size=4, cache_tokens=0)
    first = cached.prompt("s", _request(0, 12, (1, 2, 3)), 0)
    with pytest.raises(ValueError):
        first.flags.writeable = True
    shorter = _request(1, 8, [1, 2])  # type: ignore[arg-type]
    assert np.array_equal(cached.prompt("s", shorter, 0), uncached.prompt("s", shorter, 0))


def _digest(synth: PromptSynth) -> str:
    session = load_traces("agentic-coding").sessions[3]
    h = hashlib.sha256()
    for request in list(session.all_requests())[:10]:
        h.update(synth.prompt(session.id, request, salt=11).tobytes())
    return h.hexdigest()


def test_deterministic_across_instances_and_processes() -> None:
    here = _digest(PromptSynth(block_size=64))
    assert here == _digest(PromptSynth(block_size=64))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import hashlib\n"
        "from traces import PromptSynth, load_traces\n"
        "s = load_traces('agentic-coding').sessions[3]; h = hashlib.sha256(); p = PromptSynth(64)\n"
        "for r in list(s.all_requests())[:10]: h.update(p.prompt(s.id, r, salt=11).tobytes())\n"
        "print(h.hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == here


def test_bad_parameters_and_requests() -> None:
    for kwargs in ({"block_size": 0}, {"block_size": 4, "vocab_size": 0}, {"block_size": 4, "vocab_offset": -1},
                   {"block_size": 4, "vocab_size": 2**31, "vocab_offset": 1}):
        with pytest.raises(ValueError, match="PromptSynth"):
            PromptSynth(**kwargs)
    with pytest.raises(ValueError, match="exceed its 7 input tokens"):
        PromptSynth(block_size=4).prompt("s", _request(0, 7, (1, 2)), salt=0)


def test_the_tokens_are_those_of_earlier_versions() -> None:
    """Pinned values (computed before the one-pass rewrite): prompts, and so the prefix-cache
    behaviour a result depends on, stay comparable across versions. A tail shorter than a block
    and a request served from the cache, both."""
    synth = PromptSynth(4, vocab_size=1000, vocab_offset=7)
    assert synth.prompt("sess", _request(3, 10, (11, 12)), 5).tolist() == [353, 573, 535, 811, 197, 951, 652, 638,
                                                                            394, 585]
    assert synth.prompt("sess", _request(4, 7, (11,)), 5).tolist() == [353, 573, 535, 811, 987, 51, 628]


def test_block_seeds_are_the_same_scalar_or_vectorised() -> None:
    """A prompt built in one go (its many new blocks seeded by numpy) equals the same prompt grown
    a few blocks at a time (each request's new blocks seeded as Python ints)."""
    from traces.synth import SCALAR_SEEDS_UP_TO

    ids = tuple(range(100, 100 + 3 * SCALAR_SEEDS_UP_TO))
    whole = PromptSynth(block_size=8, vocab_offset=3).prompt("s", _request(0, 8 * len(ids) + 5, ids), salt=9)
    grown = PromptSynth(block_size=8, vocab_offset=3)
    for count in range(SCALAR_SEEDS_UP_TO // 2, len(ids) + 1, SCALAR_SEEDS_UP_TO // 2):
        prompt = grown.prompt("s", _request(0, 8 * count + (5 if count == len(ids) else 0), ids[:count]), salt=9)
    assert prompt.tolist() == whole.tolist()


def test_a_history_shares_its_blocks_across_salts_and_nothing_after() -> None:
    """Two plays (salts 1 and 2) of one primed context (history salt 9, hash ids 1..3): the blocks
    they share with the history are the same tokens, whichever order the cache saw them in; their
    later blocks and tails are their own; without a history they share nothing."""
    history = (9, (1, 2, 3))
    start, later, forked = _request(5, 200, (1, 2, 3)), _request(6, 300, (1, 2, 3, 4)), _request(7, 300, (1, 7, 8, 9))
    one, two = PromptSynth(block_size=64), PromptSynth(block_size=64)
    a_start, a_later = one.prompt("s", start, 1, history), one.prompt("s", later, 1, history)
    b_later, b_start = two.prompt("s", later, 2, history), two.prompt("s", start, 2, history)
    assert np.array_equal(a_start[:192], b_start[:192]) and np.array_equal(a_later[:192], b_later[:192])
    assert np.array_equal(a_start[:192], a_later[:192])
    assert set(_blocks(a_later[192:], 1, 64)).isdisjoint(_blocks(b_later[192:], 1, 64))
    assert not np.array_equal(a_start[192:], b_start[192:])  # the tails: each play's own
    a_fork, b_fork = one.prompt("s", forked, 1, history), two.prompt("s", forked, 2, history)
    assert np.array_equal(a_fork[:64], b_fork[:64]) and set(_blocks(a_fork[64:], 3, 64)).isdisjoint(
        _blocks(b_fork[64:], 3, 64))
    plain = PromptSynth(block_size=64)
    assert set(_blocks(plain.prompt("s", later, 1), 4, 64)).isdisjoint(
        _blocks(plain.prompt("s", later, 2), 4, 64))
