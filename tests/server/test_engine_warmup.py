"""The start-up warm-up: which prompts it runs, and that it leaves the engine as if it had never run."""

from __future__ import annotations

import triton

from kernels.topk import FINE_CHUNK_MAX_COLS, SINGLE_PASS_MAX_COLS
from server.engine.core import Engine
from server.engine.messages import EngineStats, SamplingParams
from server.engine.warmup import DECODE_TOKENS, SHORT_PROMPTS, prompt_ids, warmup_waves
from server.model.attention import logits_width
from tests.server.engine_fixtures import greedy, prompt, run, tiny_config


def test_waves_reach_every_top_k_path_that_fits():
    """At v32's 163,840 tokens in chunks of 2,048: the short prompts, prompts whose logits take each
    register width of the one-launch top-k, a prompt whose last chunks hold 2,048 and 17 rows past
    the one-launch width, and prompts ending in a one-token chunk past the one-launch width and
    past the fine-chunk width (with the logits' width rounded up, as the runner does). A small
    model keeps what fits."""
    waves = warmup_waves(163_840, 2048)
    assert waves[:3] == list(SHORT_PROMPTS)
    # the in-register top-k's block: the width's power of two, from the rounded width up to 8,192
    blocks = {triton.next_power_of_2(logits_width(n)) for n in waves[:7]}
    assert blocks == {512, 1024, 2048, 4096, 8192} and max(logits_width(n) for n in waves[:7]) <= SINGLE_PASS_MAX_COLS
    sampled, fine, coarse = waves[7:]
    assert sampled % 2048 == 17 and logits_width(sampled - 17) > SINGLE_PASS_MAX_COLS
    for one_row, lo, hi in ((fine, SINGLE_PASS_MAX_COLS, FINE_CHUNK_MAX_COLS), (coarse, FINE_CHUNK_MAX_COLS, None)):
        assert one_row % 2048 == 1  # its last chunk: one token
        assert logits_width(one_row) > lo and (hi is None or logits_width(one_row) <= hi)
    assert warmup_waves(1024, 512) == [*SHORT_PROMPTS, 513]
    assert warmup_waves(16, 512) == [1, 5]  # 16 + DECODE_TOKENS tokens do not fit
    assert all(n + DECODE_TOKENS <= 40_000 for n in warmup_waves(40_000, 2048))


def test_warm_up_leaves_the_engine_as_new():
    """After the warm-up's requests (greedy and sampled) the engine holds no request, no cached
    prefix of theirs and zero counters, and serves greedy and sampled requests exactly as an
    engine that never warmed up (the sampler's seed restored)."""
    warm = Engine(tiny_config())
    warm.warm_up()
    assert warm.warmup_seconds > 0
    assert warm.stats() == EngineStats()
    assert not warm.has_unfinished() and warm.blocks.num_in_use == 0 and not warm.seqs
    fresh = Engine(tiny_config())
    requests = {
        "greedy": (prompt(1, 40), greedy(8)),
        "sampled": (prompt(2, 33), SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)),
        # the last warm-up prompt again: served from no cache
        "again": (prompt_ids(SHORT_PROMPTS[-1], warm.vocab_size, len(SHORT_PROMPTS) - 1), greedy(4)),
    }
    got, want = run(warm, requests), run(fresh, requests)
    assert got == want
    assert got["again"]["cached"] == 0


def test_compile_watch_reports_and_is_replaced():
    """The watch calls back with the kernel's module and name and never skips a compile; a pause
    puts it back after; a later watch replaces it and None removes it."""
    from triton import knobs

    from server.engine.warmup import compiles_unwatched, watch_compiles

    class Fn:
        module, name = "kernels.topk", "_mark_kernel"

    seen: list[str] = []
    try:
        assert watch_compiles(seen.append)
        assert knobs.runtime.jit_cache_hook(fn=Fn(), key=None, repr="", compile={}, is_manual_warmup=False,
                                            already_compiled=False) is False
        assert seen == ["kernels.topk._mark_kernel"]
        hook = knobs.runtime.jit_cache_hook
        with compiles_unwatched():  # a benchmark's own cache fill: no report, the watch back after
            assert knobs.runtime.jit_cache_hook is None
        assert knobs.runtime.jit_cache_hook is hook
        assert watch_compiles(None) and knobs.runtime.jit_cache_hook is None
    finally:
        knobs.runtime.jit_cache_hook = None
