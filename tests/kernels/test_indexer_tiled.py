"""Tiled indexer kernel: tiles of query tokens (prefill) and one-token tiles (decode) against the paged
reference, one-request and straddling tiles, both key formats and dot paths, MXFP4 group dots, the
unmasked tail, and which kernel a paged call takes."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.indexer import TILED_MIN_TOKENS_PER_REQUEST, indexer_logits_paged
from kernels.indexer_tiled import TiledConfig, indexer_logits_tiled
from kernels.quant import decode_e2m1, decode_e4m3, indexer_row_bytes, write_indexer_cache
from kernels.triton_utils import e2m1_words_to_raw_e4m3, word_bytes
from tests.kernels.checks import assert_logits_match
from tests.kernels.test_indexer import make_cache, make_inputs


def paged_batch(gen, key_dtype: str, block_size: int, d_i: int = 64):
    """Three requests back to back: a 9-token prefill chunk at a 40-token offset, one decode token
    and a 6-token chunk from position 0, so tiles of 4 tokens both stay inside and straddle requests."""
    max_blocks = 4
    cache = make_cache(gen, 3 * max_blocks * block_size + 3, d_i, key_dtype, block_size)
    block_table = torch.randperm(3 * max_blocks, generator=gen).int().reshape(3, max_blocks)
    lens = [list(range(41, 50)), [27], list(range(1, 7))]
    seq_ids = torch.tensor([s for s, chunk in enumerate(lens) for _ in chunk], dtype=torch.int32)
    context_lens = torch.tensor([n for chunk in lens for n in chunk], dtype=torch.int32)
    q8, w = make_inputs(gen, len(seq_ids), 4, d_i)
    return q8, w, cache, block_table, seq_ids, context_lens


@pytest.mark.parametrize("fp8_dot", [False, True])
@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
@pytest.mark.parametrize("block_size", [16, 61])
def test_tiled_matches_reference(gen, key_dtype, block_size, fp8_dot):
    """Both dot paths (the interpreter emulates the e4m3 operands of the fp8 one)."""
    q8, w, cache, block_table, seq_ids, lens = paged_batch(gen, key_dtype, block_size)
    max_context = 55
    ref = indexer_logits_paged(q8, w, cache, key_dtype, block_table, block_size, seq_ids, lens, max_context,
                               backend="torch")
    got = indexer_logits_tiled(q8, w, cache, key_dtype, block_table, seq_ids, lens, block_size, max_context,
                               config=TiledConfig(4, 16, 4), fp8_dot=fp8_dot)
    assert_logits_match(got, ref)


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
def test_tiled_unmasked_tail(gen, key_dtype):
    """mask_tail=False: every column below a token's context matches; a tile's work ends at its
    largest context, so whole blocks past it stay untouched (poisoned)."""
    q8, w, cache, block_table, seq_ids, lens = paged_batch(gen, key_dtype, 16)
    ref = indexer_logits_paged(q8, w, cache, key_dtype, block_table, 16, seq_ids, lens, 64, backend="torch")
    got = indexer_logits_tiled(q8, w, cache, key_dtype, block_table, seq_ids, lens, 16, 64,
                               config=TiledConfig(4, 16, 4), mask_tail=False)
    for t, n in enumerate(lens.tolist()):
        assert_logits_match(got[t : t + 1, :n], ref[t : t + 1, :n])
    assert torch.isnan(got[-1, 16:]).all()


def spread_scale_batch(gen, spread: float, small_group_only: bool = False):
    """20 MXFP4 keys of d_I = 64 whose second group is `spread` below the first (with
    small_group_only, even rows have no first group), three query tokens of one request:
    (q8, w, cache, block table, seq ids, lengths)."""
    d_i = 64
    keys = torch.randn(20, d_i, generator=gen)
    keys[:, 32:] *= spread
    if small_group_only:
        keys[::2, :32] = 0.0
    cache = torch.zeros(20, indexer_row_bytes(d_i, "mxfp4"), dtype=torch.uint8)  # blocks of one key
    write_indexer_cache(cache, torch.arange(20), keys, "mxfp4")
    q8, w = make_inputs(gen, 3, 4, d_i)
    table = torch.arange(20, dtype=torch.int32)[None]
    return q8, w, cache, table, torch.zeros(3, dtype=torch.int32), torch.tensor([18, 19, 20], dtype=torch.int32)


def test_mxfp4_groups_far_apart_in_scale(gen):
    """Groups of one row whose scales differ by 2^10: brought to the row's scale, still exact in
    fp16 (the fp8 dot would round the small group: 2^-10 is past e4m3's exact range)."""
    q8, w, cache, table, seq_ids, lens = spread_scale_batch(gen, 2.0**-10)
    ref = indexer_logits_paged(q8, w, cache, "mxfp4", table, 1, seq_ids, lens, 20, backend="torch")
    got = indexer_logits_tiled(q8, w, cache, "mxfp4", table, seq_ids, lens, 1, 20, config=TiledConfig(2, 16, 4),
                               fp8_dot=False)
    assert_logits_match(got, ref)


def test_paged_call_takes_tiled_kernel_for_prefill_chunks(gen, monkeypatch):
    """A chunk of many tokens per request goes through the tiled kernel, with the same logits."""
    import kernels.indexer as indexer

    calls = []

    def counted(*a, **k):
        calls.append(1)
        return indexer_logits_tiled(*a, **k)

    monkeypatch.setattr(indexer, "indexer_logits_tiled", counted)
    n = TILED_MIN_TOKENS_PER_REQUEST
    cache = make_cache(gen, 64, 64, "fp8", 16)
    q8, w = make_inputs(gen, n, 4, 64)
    seq_ids = torch.zeros(n, dtype=torch.int32)
    lens = torch.arange(30, 30 + n, dtype=torch.int32)
    table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    args = (q8, w, cache, "fp8", table, 16, seq_ids, lens, 64)
    got = indexer.indexer_logits_paged(*args, backend="triton")
    assert calls == [1]
    assert_logits_match(got, indexer.indexer_logits_paged(*args, backend="torch"))


MXFP4_DECODE_CASES = [(fp8_dot, block_m, d_i) for fp8_dot in (False, True) for block_m in (1, 4)
                      for d_i in (32, 64, 128)]


@pytest.mark.parametrize(("fp8_dot", "block_m", "d_i"), MXFP4_DECODE_CASES)
def test_mxfp4_group_dots_match_reference(gen, fp8_dot, block_m, d_i):
    """MXFP4 keys scored one dot per 32-value group, each scaled by its group's scale (one-token
    tiles at d_I 128 prefetched): one-token tiles (decode) and wider tiles straddling requests,
    both dot paths, one to four groups."""
    q8, w, cache, block_table, seq_ids, lens = paged_batch(gen, "mxfp4", 16, d_i)
    ref = indexer_logits_paged(q8, w, cache, "mxfp4", block_table, 16, seq_ids, lens, 55, backend="torch")
    cfg = TiledConfig(block_m, 16, 4, mx_scoring="group_dots", prefetch=block_m == 1 and d_i == 128)
    got = indexer_logits_tiled(q8, w, cache, "mxfp4", block_table, seq_ids, lens, 16, 55, config=cfg, fp8_dot=fp8_dot)
    assert_logits_match(got, ref)


def wide_spread_batch(gen, spread: int):
    """64 MXFP4 keys of d_I = 64 (one block of the config below) whose second group's scale is
    exactly `spread` binades below the first's (each group's largest value set to 6 * 2^e, the
    rest random, so e2m1 0.5 and zeros occur), three query tokens of one request."""
    keys = torch.rand(64, 64, generator=gen) * 12 - 6
    keys[:, 0], keys[:, 32] = 6.0, -6.0
    keys[:, 32:] *= 2.0**-spread
    cache = torch.zeros(1, 64 * indexer_row_bytes(64, "mxfp4"), dtype=torch.uint8)
    write_indexer_cache(cache, torch.arange(64), keys, "mxfp4")
    scales = scale_words(cache)
    assert torch.equal(scales[:, 0].int() - scales[:, 1].int(), torch.full((64,), spread, dtype=torch.int32))
    q8, w = make_inputs(gen, 3, 4, 64)
    return q8, w, cache, torch.arange(64, dtype=torch.int32)[None], torch.zeros(3, dtype=torch.int32)


def scale_words(cache: torch.Tensor) -> torch.Tensor:
    """The 64 scale words of a one-block MXFP4 d_I = 64 cache as bytes [64, 4] (a view: writable):
    they follow the block's 64 x 32 value bytes."""
    return cache[0, 64 * 32 :].view(64, 4)


@pytest.mark.parametrize("spread", [11, 12, 40, "zero group"])
def test_group_dots_exact_at_any_spread_of_group_scales(gen, spread):
    """Group scales 11, 12 and 40 binades apart, and a scale byte 0 (the group reads as zero; here 11
    binades below a tiny first group's): the group dots scale each group's dot by its own scale, so
    all match the reference, through the fp8 dot and the fp16 one, prefetched or not."""
    q8, w, cache, table, seq_ids = wide_spread_batch(gen, 11 if spread == "zero group" else spread)
    if spread == "zero group":
        scale_words(cache)[:, :2] = torch.tensor([11, 0], dtype=torch.uint8)
    lens = torch.tensor([62, 63, 64], dtype=torch.int32)
    ref = indexer_logits_paged(q8, w, cache, "mxfp4", table, 64, seq_ids, lens, 64, backend="torch")
    for fp8_dot, prefetch in [(True, True), (False, False)]:
        got = indexer_logits_tiled(q8, w, cache, "mxfp4", table, seq_ids, lens, 64, 64, fp8_dot=fp8_dot,
                                   config=TiledConfig(1, 64, 4, mx_scoring="group_dots", prefetch=prefetch))
        assert_logits_match(got, ref)


@triton.jit
def _nibble_words_kernel(words_ptr, low_ptr, high_ptr):
    rows = tl.arange(0, 4)[:, None]
    low, high = e2m1_words_to_raw_e4m3(tl.load(words_ptr + rows * 16 + tl.arange(0, 16)[None, :]))
    out = rows * 64 + tl.arange(0, 64)[None, :]
    tl.store(low_ptr + out, word_bytes(low))
    tl.store(high_ptr + out, word_bytes(high))


def test_nibble_words_decode_to_e4m3_bytes():
    """Every byte value, loaded as int32 words: its low and its high nibble come back as e4m3 bytes
    worth the e2m1 value / 2^6, in memory order (no carry between a word's bytes)."""
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    low, high = torch.empty(256, dtype=torch.uint8), torch.empty(256, dtype=torch.uint8)
    _nibble_words_kernel[(1,)](data.view(torch.int32).reshape(4, 16), low, high)
    assert torch.equal(decode_e4m3(low) * 64, decode_e2m1(data & 0xF))
    assert torch.equal(decode_e4m3(high) * 64, decode_e2m1(data >> 4))
    assert torch.equal(torch.signbit(decode_e4m3(high)), (data >> 7).bool())


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
@pytest.mark.parametrize("block_size", [16, 61])
def test_prefetched_blocks_match_reference(gen, key_dtype, block_size):
    """Next-block prefetch (loads carried across the loop, the last one masked off past the end)
    with blocks of 32 keys over cache blocks of 16 (two runs of slots per key block) and 61 (a
    block-table lookup per key); one-token tiles (also with the unmasked tail) and 4-token tiles
    straddling requests, d_I 128 (fp8 rows carried as words, MXFP4 as group dots)."""
    q8, w, cache, block_table, seq_ids, lens = paged_batch(gen, key_dtype, block_size, 128)
    ref = indexer_logits_paged(q8, w, cache, key_dtype, block_table, block_size, seq_ids, lens, 55, backend="torch")
    for block_m in (1, 4):
        cfg = TiledConfig(block_m, 32, 4, mx_scoring="group_dots" if key_dtype == "mxfp4" else "rows", prefetch=True)
        got = indexer_logits_tiled(q8, w, cache, key_dtype, block_table, seq_ids, lens, block_size, 55, config=cfg,
                                   fp8_dot=True)
        assert_logits_match(got, ref)
    one_token = TiledConfig(1, 32, 4, mx_scoring="group_dots" if key_dtype == "mxfp4" else "rows", prefetch=True)
    tail = indexer_logits_tiled(q8, w, cache, key_dtype, block_table, seq_ids, lens, block_size, 64,
                                config=one_token, fp8_dot=True, mask_tail=False)
    for t, n in enumerate(lens.tolist()):
        assert_logits_match(tail[t : t + 1, :n], ref[t : t + 1, :n])


def test_mxfp4_group_dots_exact_at_any_scale_spread(gen):
    """Groups 2^20 apart in scale: with a dot per group the e4m3 operands hold e2m1 values as they
    are (no common row scale), so even the fp8 dot keeps the small group's contribution."""
    q8, w, cache, table, seq_ids, lens = spread_scale_batch(gen, 2.0**-20, small_group_only=True)
    ref = indexer_logits_paged(q8, w, cache, "mxfp4", table, 1, seq_ids, lens, 20, backend="torch")
    got = indexer_logits_tiled(q8, w, cache, "mxfp4", table, seq_ids, lens, 1, 20,
                               config=TiledConfig(1, 16, 4, mx_scoring="group_dots"), fp8_dot=True)
    assert_logits_match(got[:, ::2], ref[:, ::2])
    assert_logits_match(got, ref)


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
def test_decode_takes_one_token_tiles_where_fp8_dots_exist(gen, monkeypatch, key_dtype):
    """A decode batch (one token per request) goes through the tiled kernel with one-token tiles
    (MXFP4 as group dots) on a device with fp8 dots (faked here: the interpreter emulates them),
    else through the per-token kernel; the logits match the reference either way."""
    import kernels.indexer as indexer
    import kernels.indexer_tiled as tiled

    configs = []

    def counted(*a, **k):
        configs.append(a[9])
        return indexer_logits_tiled(*a, **k)

    monkeypatch.setattr(indexer, "indexer_logits_tiled", counted)
    cache = make_cache(gen, 4 * 64, 64, key_dtype, 16)
    q8, w = make_inputs(gen, 3, 4, 64)
    table = torch.randperm(12, generator=gen).int().reshape(3, 4)
    args = (q8, w, cache, key_dtype, table, 16, torch.arange(3, dtype=torch.int32),
            torch.tensor([5, 64, 33], dtype=torch.int32), 64)
    ref = indexer.indexer_logits_paged(*args, backend="torch")
    assert_logits_match(indexer.indexer_logits_paged(*args, backend="triton"), ref)
    assert configs == []
    monkeypatch.setattr(tiled, "fp8_dot_supported", lambda device: True)
    assert_logits_match(indexer.indexer_logits_paged(*args, backend="triton"), ref)
    assert [(c.block_m, c.mx_scoring) for c in configs] == [(1, "group_dots" if key_dtype == "mxfp4" else "rows")]


def test_one_wave_config_reaches_the_grid(gen, monkeypatch):
    """A config's one_wave is how its launch's grid is rounded (MXFP4 decode at 64 heads asks for it)."""
    import kernels.indexer_tiled as tiled

    monkeypatch.setattr(tiled, "fp8_dot_supported", lambda device: True)
    cfg = tiled.decode_tiled_config("mxfp4", 64, torch.device("cpu"))
    assert cfg is not None and cfg.one_wave
    asked = []
    monkeypatch.setattr(tiled, "row_programs", lambda *args: asked.append(args[3:]) or 2)
    residency = {}
    monkeypatch.setattr(tiled, "_RESIDENT", residency)
    # what a launch on a GPU would read from the compiled kernel (here: the interpreter's, which has none)
    monkeypatch.setattr(tiled, "kernel_residency", lambda compiled, device: 5)
    q8, w, cache, block_table, seq_ids, lens = paged_batch(gen, "mxfp4", 16)
    for config in (cfg, cfg, TiledConfig(1, 16, 4, mx_scoring="group_dots")):
        indexer_logits_tiled(q8, w, cache, "mxfp4", block_table, seq_ids, lens, 16, 55, config, fp8_dot=False)
    # the first launch takes the config's programs per SM, later ones the compiled kernel's residency
    assert asked == [(cfg.programs_per_sm, True), (5, True), (4, False)]
    assert list(residency.values()) == [5]


def test_residency_of_a_compiled_kernel(monkeypatch):
    """Programs an H200 SM (65,536 registers, 228 KB shared, 2,048 threads) holds: the MXFP4 decode
    kernel at 168 registers and 4 warps 3 (12 warps of 5,376 registers); 128 registers 4; 80
    registers 6 (rounded to 2,560 a warp: 25 warps); shared memory or threads bound others."""
    import kernels.triton_utils as tu

    h200 = (65536, 233472, 2048)
    assert tu.programs_resident(168, 0, 4, *h200) == 3
    assert tu.programs_resident(128, 0, 4, *h200) == 4
    assert tu.programs_resident(80, 34_000, 4, *h200) == 6
    assert tu.programs_resident(80, 60_000, 4, *h200) == 3  # 61 KB a program with the reserved 1 KB
    assert tu.programs_resident(32, 0, 4, *h200) == 16  # threads: 2,048 / 128
    assert tu.programs_resident(255, 200_000, 8, *h200) == 1

    class Compiled:
        n_regs, metadata = 168, type("Metadata", (), {"shared": 1024, "num_warps": 4})

    monkeypatch.setattr(tu, "sm_resources", lambda device: h200)
    assert tu.kernel_residency(Compiled(), torch.device("cuda")) == 3
    assert tu.kernel_residency(Compiled(), torch.device("cpu")) is None  # the interpreter: no registers
    monkeypatch.setattr(tu, "sm_resources", lambda device: None)  # ROCm
    assert tu.kernel_residency(Compiled(), torch.device("cuda")) is None


def test_one_wave_grid_rounds_down():
    """16 rows on 396 slots (132 SMs x 3): rounding up gives 25 programs a row, 400 in all, and the
    last 4 would run after the others; one wave takes 24. Never more than a row's blocks, never 0."""
    from kernels.triton_utils import programs_per_row

    assert programs_per_row(16, 1024, 396) == 25
    assert programs_per_row(16, 1024, 396, one_wave=True) == 24
    assert programs_per_row(1, 10, 396, one_wave=True) == 10
    assert programs_per_row(500, 1024, 396, one_wave=True) == 1
