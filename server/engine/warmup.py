"""Kernel warm-up before the server reports ready, and a watch for Triton compiles while serving.

Triton compiles a kernel the first time it runs with new compile-time constants or a new
specialisation of an integer argument (equal to 1, divisible by 16, or neither), and a compile
takes up to seconds. The decode graphs compile theirs when they are captured, but prefill steps
run eagerly: without this warm-up each new kind of prefill step would compile in the middle of a
run and stall every request of its batch, and the run's TTFT and ITL tails would report the
compiler rather than the server.

Two things keep a run free of them. The integer arguments that move with the batch are kept in
one class (the indexer logits' width and the block table's width are rounded up: see
`server.model.attention.logits_width` and `server.engine.block_table`; token counts that only bound
masks are unspecialised). And the requests of `warmup_waves` run before the server is ready: one
prefill step of each kind the top-k chooses between (kernels/topk/: the row in registers up to
SINGLE_PASS_MAX_COLS, at each of its register widths, the sampled pass over many rows, the
compacting pass over few rows, with fine and coarse chunks) and steps of 1, 5 and 16 tokens, each
request alone in its batch. Each then decodes a few tokens, greedy and sampled. What still
compiles while serving is logged and counted (`watch_compiles`), so a run that met one can be told
apart. Eager decode and verification steps (`--enforce-eager`, `--tp N > 1`, ragged speculative
verification) are covered only as far as the prefill steps share their kernels.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator

import triton

from kernels.topk import FINE_CHUNK_MAX_COLS, SINGLE_PASS_MAX_COLS
from server.model.attention import LOGITS_WIDTH_MULTIPLE

log = logging.getLogger(__name__)

SHORT_PROMPTS = (1, 5, 16)  # steps of one token, a few, and a multiple of 16
DECODE_TOKENS = 3


def warmup_waves(max_model_len: int, chunk: int) -> list[int]:
    """Prompt lengths, one request per wave, for a model of `max_model_len` tokens whose prefill
    runs in chunks of `chunk` tokens (max_num_batched_tokens): the short prompts, then
    - ones whose last chunk's logits are each power-of-two width past LOGITS_WIDTH_MULTIPLE up to
      SINGLE_PASS_MAX_COLS wide: the top-k with the row in registers, whose register block is the
      width's power of two (a compile-time constant);
    - one whose last chunks, past SINGLE_PASS_MAX_COLS columns, hold `chunk` rows and then 17: the
      sampled top-k;
    - ones ending in a one-token chunk past SINGLE_PASS_MAX_COLS and past FINE_CHUNK_MAX_COLS
      columns: the compacting top-k over one row, with fine and with coarse chunks.
    Lengths that do not fit the model are left out."""
    in_registers, width = [], 2 * LOGITS_WIDTH_MULTIPLE
    while width <= SINGLE_PASS_MAX_COLS:
        in_registers.append(width // 2 + 1)
        width *= 2
    one_row = [-(-cols // chunk) * chunk + 1 for cols in (SINGLE_PASS_MAX_COLS + 1, FINE_CHUNK_MAX_COLS + 1)]
    lengths = [*SHORT_PROMPTS, *in_registers, SINGLE_PASS_MAX_COLS + chunk + 17, *one_row]
    return [n for n in lengths if n + DECODE_TOKENS <= max_model_len]


def watch_compiles(on_compile: Callable[[str], None] | None) -> bool:
    """Call on_compile(kernel name) whenever this process is about to compile (or load from the
    disk cache) a Triton kernel, in place of any earlier watch; None: no watch (a new engine's
    capture and warm-up are not compiles while serving). False where Triton has no such hook."""
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_cache_hook"):
        return False
    if on_compile is None:
        knobs.runtime.jit_cache_hook = None
        return True
    report = on_compile

    def hook(*, fn, **_) -> bool:
        report(f"{fn.module}.{fn.name}")
        return False  # True would skip the compile

    knobs.runtime.jit_cache_hook = hook
    return True


@contextlib.contextmanager
def compiles_unwatched() -> Iterator[None]:
    """Compiles inside are not serving's (a benchmark filling the cache behind the engine's back):
    the watch is paused and put back after."""
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_cache_hook"):
        yield
        return
    saved, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, None
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = saved


def prompt_ids(length: int, vocab_size: int, seed: int) -> tuple[int, ...]:
    """Random token ids: no prefix shared with another warm-up prompt or with a real one."""
    rng = random.Random(seed)
    return tuple(rng.randrange(vocab_size) for _ in range(length))


def log_compile_while_serving(name: str) -> None:
    log.warning("Triton compiles %s while serving (a kind of step the start-up warm-up did not run): "
                "the requests of this step wait for it, and latencies measured now include the wait", name)
