"""Indexer logits on tensor cores: a tile of query tokens scores each block of keys with one dot.

The per-token kernel (kernels/indexer.py) loads and decodes every key once per query token. A
prefill chunk's tokens share their keys, so here a program holds BLOCK_M consecutive tokens' queries,
all heads, as one [BLOCK_M * H, d_I] operand, and for each block of keys computes

    scores[key, token * H + h] = k[key] . q[token, h]                  (one dot)
    logits[key, token] = sum_h w[token, h] * relu(scores[key, token, h])  (a reshape and a sum)

so a key block is loaded (and decoded) once per BLOCK_M tokens. Where the device has fp8 tensor
cores (FP8_DOT) the dot takes e4m3 operands: fp8 keys and the queries are their bytes
reinterpreted (no decode); otherwise fp16 decoded by integer arithmetic (kernels/triton_utils.py).
MXFP4 rows are brought to one scale per row: each 32-value group's e2m1 values are multiplied by
2^-drop, drop = the row's largest group scale minus the group's, in fp16 (exact down to 2^-24),
so the whole row is one dot and the row's scale multiplies the result. For an fp8 dot these
values are then converted to e4m3, exact while drop <= 8 (e2m1 values have two significant bits
and stay multiples of 2^-9); groups more than 2^8 below their row's largest are rounded to e4m3
(3 mantissa bits, subnormals down to 2^-9), a change far below the indexer's bar.

Decode and verify steps use tiles of one token (`decode_tiled_config`) on GPUs with fp8 dots:
there the gain is not shared key loads but the dot taking the key bytes as they are, where the
per-token kernel decodes every key element to fp16 first. MXFP4 keys then take one dot per
32-value group (`TiledConfig.mx_scoring` "group_dots"): the group's nibbles are loaded as int32
words and become e4m3 bytes four at a time (shifts and masks on whole words, low and high
nibbles to separate words; the query group is permuted to the order that leaves), and each
group's scale multiplies its dot's result: no key value is rounded, at any spread of group
scales. (Adding each group's scale to its bytes' e4m3 exponents instead, for one dot per block
with an exact fallback, is slower.) With 64 heads the next key block is prefetched
(`TiledConfig.prefetch`): its loads go out before this block's dots. A key block's cache slots
come in runs inside one cache block (one block-table load per run, `_block_key_words`).

Tokens of one request are contiguous in a batch. A tile whose tokens all belong to one request
makes one pass over its keys; a tile straddling requests makes one pass per token (the other
tokens' weights zeroed), so mixed batches stay correct. The loop bound is read on the device
(the tile's largest context), so the grid depends only on the shapes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.quant import indexer_value_bytes
from kernels.quant_kernels import key_words
from kernels.triton_utils import (
    E2M1_RAW_E4M3_SCALE,
    E2M1_RAW_SCALE,
    E4M3_RAW_SCALE,
    dot_dtype,
    e2m1_to_raw_f16,
    e2m1_words_to_raw_e4m3,
    e4m3_to_raw_f16,
    kernel_residency,
    new_output,
    row_programs,
    ue8m0_to_f32,
    word_bytes,
)


@triton.jit
def _fp8_block(key_ptr, key_words_ptr, value_words, scale_words, visible, D: tl.constexpr, AS_WORDS: tl.constexpr):
    """The loads of a block of fp8 keys: (their d_I value bytes [BLOCK_N, D], or as int32 words
    [BLOCK_N, D / 4] with AS_WORDS; scale bits [BLOCK_N])."""
    if AS_WORDS:
        raw = tl.load(key_words_ptr + value_words[:, None] + tl.arange(0, D // 4)[None, :], mask=visible[:, None],
                      other=0)
    else:
        raw = tl.load(key_ptr + 4 * value_words[:, None] + tl.arange(0, D)[None, :], mask=visible[:, None], other=0)
    return raw, tl.load(key_words_ptr + scale_words, mask=visible, other=0)


@triton.jit
def _fp8_keys(raw, scale_bits, AS_WORDS: tl.constexpr, FP8_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """A block of fp8 keys (_fp8_block) -> (dot operand [BLOCK_N, D], per-key factor that turns the
    dot into q . k)."""
    scale = scale_bits.to(tl.float32, bitcast=True)
    if AS_WORDS:
        raw = word_bytes(raw)
    if FP8_DOT:
        keys = raw.to(tl.float8e4nv, bitcast=True)
    else:
        keys = e4m3_to_raw_f16(raw.to(tl.int32)).to(DOT_DTYPE)
        scale = scale * (E4M3_RAW_SCALE * E4M3_RAW_SCALE)
    return keys, scale


@triton.jit
def _mxfp4_row_block(key_ptr, value_words, scale_words, visible, D: tl.constexpr):
    """The loads of a block of MXFP4 keys scored as whole rows: (the byte holding each element,
    each element's group scale byte), both [BLOCK_N, D]. Element i is nibble i % 2 of byte i // 2
    (each byte is loaded twice, from the same line)."""
    dims = tl.arange(0, D)
    packed = tl.load(key_ptr + 4 * value_words[:, None] + dims[None, :] // 2, mask=visible[:, None], other=0)
    group_exp = tl.load(key_ptr + 4 * scale_words[:, None] + dims[None, :] // 32, mask=visible[:, None], other=0)
    return packed, group_exp


@triton.jit
def _mxfp4_keys(packed, group_exp, D: tl.constexpr, FP8_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """A block of MXFP4 keys (_mxfp4_row_block) -> (operand [BLOCK_N, D] at one scale per row,
    per-key factor)."""
    dims = tl.arange(0, D)
    raw = e2m1_to_raw_f16((packed.to(tl.int32) >> ((dims & 1) * 4)[None, :]) & 0xF)  # value / 2^14
    group_exp = group_exp.to(tl.int32)
    row_exp = tl.max(group_exp, axis=1)
    # 2^(14 - drop) as fp16 bits (exponent bias 15); a group 2^28 below the row's largest is flushed
    drop = row_exp[:, None] - group_exp
    factor = tl.where(drop <= 28, (29 - drop) << 10, 0).to(tl.int16).to(tl.float16, bitcast=True)
    keys = raw * factor  # = value * 2^-drop: exact products of powers of two
    row_scale = ue8m0_to_f32(row_exp)
    if FP8_DOT:  # e4m3 holds value * 2^-drop exactly while drop <= 8 (two significant bits, >= 2^-9)
        keys = keys.to(tl.float8e4nv)
    else:
        keys = keys.to(DOT_DTYPE)
        row_scale = row_scale * E4M3_RAW_SCALE
    return keys, row_scale


@triton.jit
def _query_slice(q_ptr, row_tok, row_head, row_ok, FIRST: tl.constexpr, WIDTH: tl.constexpr, H: tl.constexpr,
                 D: tl.constexpr, FP8_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Query elements FIRST..FIRST+WIDTH-1 of every operand row [rows, WIDTH], in the order of an
    MXFP4 operand made of nibble words (_nibble_operand_words): column k holds element
    FIRST + 8(k // 8) + 2(k % 4) + (k // 4) % 2."""
    k = tl.arange(0, WIDTH)
    element = FIRST + 8 * (k // 8) + 2 * (k % 4) + (k // 4) % 2
    ptr = q_ptr + row_tok[:, None] * (H * D) + row_head[:, None] * D + element[None, :]
    raw = tl.load(ptr, mask=row_ok[:, None], other=0)
    if FP8_DOT:
        q = raw.to(tl.float8e4nv, bitcast=True)
    else:
        q = e4m3_to_raw_f16(raw.to(tl.int32)).to(DOT_DTYPE)
    return q


@triton.jit
def _mxfp4_nibble_words(key_words_ptr, value_words, visible, FIRST: tl.constexpr, COUNT: tl.constexpr):
    """Nibble words FIRST..FIRST+COUNT-1 of each MXFP4 key (8 elements each: a group is 4 words) as
    int32 [BLOCK_N, COUNT]."""
    return tl.load(key_words_ptr + value_words[:, None] + FIRST + tl.arange(0, COUNT)[None, :],
                   mask=visible[:, None], other=0)


@triton.jit
def _mxfp4_group_scores(words, scale_bytes, q_g, g: tl.constexpr, FP8_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Scores of MXFP4 group g [BLOCK_N, rows], scaled to q . k, from its nibble words [BLOCK_N, 4]
    (_mxfp4_nibble_words) and the keys' scale words (group g's byte in bits 8g..).

    The nibbles become e4m3 bytes four at a time on int32 words (low nibbles: the even elements,
    high: the odd ones), and the operand is those words' bytes as they lie, words ordered (low
    word 0, high word 0, low word 1, ...): no per-element unpacking or interleave; the query
    group is permuted to match (_query_slice). The group's power-of-two scale multiplies the
    dot's fp32 result, so every group keeps its values whatever its scale (no common row scale,
    no rounding of small groups)."""
    low, high = e2m1_words_to_raw_e4m3(words)
    raw = word_bytes(_interleave(low, high))  # e2m1 values / 2^6 as e4m3
    if FP8_DOT:
        keys = raw.to(tl.float8e4nv, bitcast=True)
        raw_scale = E2M1_RAW_E4M3_SCALE  # fp8 queries are their own value
    else:
        keys = e4m3_to_raw_f16(raw.to(tl.int32)).to(DOT_DTYPE)  # e2m1 value / 2^14
        raw_scale = E2M1_RAW_SCALE * E4M3_RAW_SCALE
    scale = ue8m0_to_f32((scale_bytes >> (8 * g)) & 0xFF)
    return tl.dot(keys, tl.trans(q_g)) * (scale * raw_scale)[:, None]


@triton.jit
def _interleave(low, high):
    """Words [R, n] and [R, n] -> [R, 2n] ordered low 0, high 0, low 1, high 1, ..."""
    return tl.reshape(tl.join(low, high), (low.shape[0], 2 * low.shape[1]))


@triton.jit
def _mxfp4_group_dots(scale_bytes, w0, w1, w2, w3, q0, q1, q2, q3, D: tl.constexpr, FP8_DOT: tl.constexpr,
                      DOT_DTYPE: tl.constexpr):
    """Scores [BLOCK_N, rows] of MXFP4 keys as one dot per group (_mxfp4_group_scores), from the
    block's loads (_load_block) and the query groups (_query_groups)."""
    scores = _mxfp4_group_scores(w0, scale_bytes, q0, 0, FP8_DOT, DOT_DTYPE)
    if D >= 64:
        scores += _mxfp4_group_scores(w1, scale_bytes, q1, 1, FP8_DOT, DOT_DTYPE)
    if D >= 128:
        scores += _mxfp4_group_scores(w2, scale_bytes, q2, 2, FP8_DOT, DOT_DTYPE)
        scores += _mxfp4_group_scores(w3, scale_bytes, q3, 3, FP8_DOT, DOT_DTYPE)
    return scores


@triton.jit
def _query_groups(q_ptr, row_tok, row_head, row_ok, H: tl.constexpr, D: tl.constexpr, FP8_DOT: tl.constexpr,
                  DOT_DTYPE: tl.constexpr):
    """The four 32-element query groups of every operand row (d_I < 128 repeats its groups)."""
    q0 = _query_slice(q_ptr, row_tok, row_head, row_ok, 0, 32, H, D, FP8_DOT, DOT_DTYPE)
    q1 = _query_slice(q_ptr, row_tok, row_head, row_ok, 32 % D, 32, H, D, FP8_DOT, DOT_DTYPE)
    q2 = _query_slice(q_ptr, row_tok, row_head, row_ok, 64 % D, 32, H, D, FP8_DOT, DOT_DTYPE)
    q3 = _query_slice(q_ptr, row_tok, row_head, row_ok, 96 % D, 32, H, D, FP8_DOT, DOT_DTYPE)
    return q0, q1, q2, q3


@triton.jit
def _block_key_words(table_row_ptr, first_col, end, block_size, BLOCK_N: tl.constexpr, RUN: tl.constexpr,
                     VALUE_WORDS: tl.constexpr):
    """(first value word, scale word) of columns first_col .. first_col + BLOCK_N - 1 of one request
    [BLOCK_N] (key_words).

    The host picks RUN, a power of two dividing both BLOCK_N and block_size, so the block's
    columns come in runs of RUN consecutive keys inside one cache block: one block-table load and
    one division per run, not per column (with RUN = 1, any block_size, per column)."""
    run_cols = first_col + RUN * tl.arange(0, BLOCK_N // RUN)
    block = tl.load(table_row_ptr + run_cols // block_size, mask=run_cols < end, other=0)
    values, scales = key_words(block.to(tl.int64), run_cols % block_size, block_size, VALUE_WORDS)
    in_run = tl.arange(0, RUN)[None, :]
    return (tl.reshape(values[:, None] + VALUE_WORDS * in_run, (BLOCK_N,)),
            tl.reshape(scales[:, None] + in_run, (BLOCK_N,)))


@triton.jit
def _load_block(key_ptr, key_words_ptr, table_row_ptr, blk, end, block_size, VALUE_WORDS: tl.constexpr,
                D: tl.constexpr, BLOCK_N: tl.constexpr, RUN: tl.constexpr, MXFP4: tl.constexpr,
                MX_GROUP_DOTS: tl.constexpr, PREFETCH: tl.constexpr):
    """Every load of key block blk (past the end: masked off, no memory traffic) as five tensors:
    fp8 (bytes, scale bits), MXFP4 rows (bytes, group scale bytes), MXFP4 group dots (the scale
    bytes, then each group's nibble words: d_I < 128 repeats its groups); unused ones repeat one.
    Prefetched fp8 bytes are carried across the loop as int32 words: as bytes, the compiler
    repacks them at the loop boundary (a byte-permute per word)."""
    visible = blk * BLOCK_N + tl.arange(0, BLOCK_N) < end
    value_words, scale_words = _block_key_words(table_row_ptr, blk * BLOCK_N, end, block_size, BLOCK_N, RUN,
                                                VALUE_WORDS)
    if MXFP4 and MX_GROUP_DOTS:  # the scale word: group g's ue8m0 byte in bits 8g..
        a = tl.load(key_words_ptr + scale_words, mask=visible, other=0)
        b = _mxfp4_nibble_words(key_words_ptr, value_words, visible, 0, 4)
        c = _mxfp4_nibble_words(key_words_ptr, value_words, visible, 32 % D // 8, 4)
        d = _mxfp4_nibble_words(key_words_ptr, value_words, visible, 64 % D // 8, 4)
        e = _mxfp4_nibble_words(key_words_ptr, value_words, visible, 96 % D // 8, 4)
    elif MXFP4:
        a, b = _mxfp4_row_block(key_ptr, value_words, scale_words, visible, D)
        c, d, e = b, b, b
    else:
        a, b = _fp8_block(key_ptr, key_words_ptr, value_words, scale_words, visible, D, PREFETCH)
        c, d, e = b, b, b
    return a, b, c, d, e


# n_tokens unspecialised: a prefill chunk may hold any number of tokens, and a specialisation for
# each class of it (1, divisible by 16, other) compiled anew mid-run (server/engine/warmup.py); it
# only bounds masks, so the kernel's code does not depend on it. block_size as in kernels/indexer.py.
@triton.jit(do_not_specialize=["n_tokens", "block_size"])
def _indexer_tiled_kernel(
    q_ptr, w_ptr, key_ptr, key_words_ptr, out_ptr,
    block_table_ptr, seq_ids_ptr, end_ptr,
    n_tokens, n_cols, block_table_stride, block_size,
    VALUE_WORDS: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RUN: tl.constexpr,
    MXFP4: tl.constexpr, MX_GROUP_DOTS: tl.constexpr, FP8_DOT: tl.constexpr,
    MASK_TAIL: tl.constexpr, PREFETCH: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """Grid (token tiles, programs per tile): program p scores the tile's key blocks p, p + P, ..."""
    rows = tl.arange(0, BLOCK_M * BLOCK_H)  # operand row = token of the tile * BLOCK_H + head
    row_tok = tl.program_id(0) * BLOCK_M + rows // BLOCK_H
    row_head = rows % BLOCK_H
    row_ok = (row_tok < n_tokens) & (row_head < H)
    if MXFP4 and MX_GROUP_DOTS:  # one query slice per 32-value group (d_I <= 128: at most four)
        q0, q1, q2, q3 = _query_groups(q_ptr, row_tok, row_head, row_ok, H, D, FP8_DOT, DOT_DTYPE)
    else:
        q_raw = tl.load(q_ptr + row_tok[:, None] * (H * D) + row_head[:, None] * D + tl.arange(0, D)[None, :],
                        mask=row_ok[:, None], other=0)
        if FP8_DOT:
            q = q_raw.to(tl.float8e4nv, bitcast=True)
        else:
            q = e4m3_to_raw_f16(q_raw.to(tl.int32)).to(DOT_DTYPE)
    w = tl.load(w_ptr + row_tok * H + row_head, mask=row_ok, other=0.0)

    toks = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tok_ok = toks < n_tokens
    ends = tl.load(end_ptr + toks, mask=tok_ok, other=0)
    seqs = tl.load(seq_ids_ptr + toks, mask=tok_ok, other=-1)
    first_seq = tl.load(seq_ids_ptr + tl.program_id(0) * BLOCK_M)
    one_request = tl.max(tl.where(tok_ok, seqs, first_seq), axis=0) == tl.min(tl.where(tok_ok, seqs, first_seq),
                                                                                  axis=0)
    passes = tl.where(one_request, 1, tl.minimum(BLOCK_M, n_tokens - tl.program_id(0) * BLOCK_M))
    tok_idx = tl.arange(0, BLOCK_M)
    for p in range(0, passes):
        # pass p: every token of a one-request tile, else token p alone
        mine = tl.where(one_request, tok_ok, tok_ok & (tok_idx == p))
        seq = tl.sum(tl.where(tok_idx == p, seqs, 0), axis=0).to(tl.int64)
        w_pass = tl.where(one_request, w, tl.where(rows // BLOCK_H == p, w, 0.0))
        end_max = tl.max(tl.where(mine, ends, 0), axis=0)
        limit = n_cols if MASK_TAIL else tl.minimum(end_max, n_cols)
        table_row = block_table_ptr + seq * block_table_stride
        if PREFETCH:
            ra, rb, rc, rd, re = _load_block(key_ptr, key_words_ptr, table_row, tl.program_id(1), end_max, block_size,
                                             VALUE_WORDS, D, BLOCK_N, RUN, MXFP4, MX_GROUP_DOTS, PREFETCH)
        for blk in range(tl.program_id(1), tl.cdiv(limit, BLOCK_N), tl.num_programs(1)):
            if PREFETCH:  # the next block's loads go out before this block's dots, so their latency overlaps
                na, nb, nc, nd, ne = _load_block(key_ptr, key_words_ptr, table_row, blk + tl.num_programs(1),
                                                 end_max, block_size, VALUE_WORDS, D, BLOCK_N, RUN, MXFP4,
                                                 MX_GROUP_DOTS, PREFETCH)
            else:
                ra, rb, rc, rd, re = _load_block(key_ptr, key_words_ptr, table_row, blk, end_max, block_size,
                                                 VALUE_WORDS, D, BLOCK_N, RUN, MXFP4, MX_GROUP_DOTS, PREFETCH)
            cols = blk * BLOCK_N + tl.arange(0, BLOCK_N)
            if MXFP4 and MX_GROUP_DOTS:
                scores = _mxfp4_group_dots(ra, rb, rc, rd, re, q0, q1, q2, q3, D, FP8_DOT, DOT_DTYPE)
                key_factor = tl.full((BLOCK_N,), 1.0, tl.float32)
            else:
                if MXFP4:
                    keys, key_factor = _mxfp4_keys(ra, rb, D, FP8_DOT, DOT_DTYPE)
                else:
                    keys, key_factor = _fp8_keys(ra, rb, PREFETCH, FP8_DOT, DOT_DTYPE)
                scores = tl.dot(keys, tl.trans(q))  # [BLOCK_N, BLOCK_M * BLOCK_H]
            weighted = tl.maximum(scores, 0.0) * w_pass[None, :]
            logits = tl.sum(tl.reshape(weighted, (BLOCK_N, BLOCK_M, BLOCK_H)), axis=2) * key_factor[:, None]
            logits = tl.where(cols[:, None] < ends[None, :], logits, float("-inf"))
            tl.store(out_ptr + toks[None, :].to(tl.int64) * n_cols + cols[:, None], logits,
                     mask=mine[None, :] & (cols < n_cols)[:, None])
            if PREFETCH:
                ra, rb, rc, rd, re = na, nb, nc, nd, ne


MX_SCORINGS = ("rows", "group_dots")


@dataclass(frozen=True)
class TiledConfig:
    """Query tokens per tile, keys per block, warps, programs per multiprocessor, pipelining depth.

    Check a new shape on the GPU before using it (benchmarks/kernels.py --only prefill): a tile can
    compile to wrong logits (one of 8 tokens x 64 keys with 8 warps has, where the same tile with
    128 keys and 4 warps, and every 4-token tile, matched the reference)."""

    block_m: int
    block_n: int
    num_warps: int
    programs_per_sm: int = 4
    num_stages: int | None = None
    # How MXFP4 keys are scored (MX_SCORINGS): "rows" brings each row to one scale in fp16 (per-element
    # work, shared by wide prefill tiles; groups more than 2^8 below their row's largest are rounded on
    # the fp8 dot); "group_dots" takes one dot per 32-value group, each group's scale on its result (one
    # [keys, rows] fp32 multiply-add per group), rounding no key value.
    mx_scoring: str = "rows"
    # Load the next key block before scoring this one (the loads are carried in registers across
    # the loop): the global-load latency overlaps the dots instead of stalling each block.
    prefetch: bool = False
    # The grid is one wave (triton_utils.row_programs rounds down) of the programs an SM holds at
    # once: programs_per_sm at the first launch, then what the compiled kernel's registers and shared
    # memory allow (triton_utils.kernel_residency), so another GPU or compiler gets its own count.
    one_wave: bool = False

    def __post_init__(self) -> None:
        if self.mx_scoring not in MX_SCORINGS:
            raise ValueError(f"TiledConfig.mx_scoring={self.mx_scoring!r}: expected one of {MX_SCORINGS}")


def default_tiled_config(key_dtype: str, device: torch.device) -> TiledConfig:
    """Interpreter: small tiles that still span two tokens. GPU: the fastest tiles for a prefill
    chunk (benchmarks/kernels.py --only prefill). MXFP4 keys are decoded per element (ALU work):
    with fp8 dots an 8-token tile shares that work best; with fp16 dots a 2-token tile does. fp8
    keys on fp8 dots run without the loop's software pipelining (num_stages 1), which long chunks
    run faster than at the compiler's default depth (`--prefill-chunk 8192 --prefill-context
    163840`), as fast as with the keys through a tensor descriptor."""
    if device.type != "cuda":
        return TiledConfig(2, 16, 4)
    if key_dtype == "mxfp4":
        return TiledConfig(8, 128, 4) if fp8_dot_supported(device) else TiledConfig(2, 128, 4)
    return TiledConfig(4, 128, 4, num_stages=1) if fp8_dot_supported(device) else TiledConfig(4, 128, 4)


def decode_tiled_config(key_dtype: str, heads: int, device: torch.device) -> TiledConfig | None:
    """One-token tiles for decode and verify steps on GPUs with fp8 dots, else None (the per-token
    kernel). With 64 heads the next block's loads are prefetched, their latency hidden behind this
    block's dots; with 16 heads prefetching gains nothing, and MXFP4's group dots run faster
    without it. MXFP4 keys score as group dots (faster than folding the group scales into the
    keys' exponents). MXFP4 at 64 heads runs one wave of the programs an SM holds (read from the
    compiled kernel after its first launch): a grid of a fixed count per SM, rounded up, leaves a
    partial wave, and capping the registers to fit more programs spills. `benchmarks/indexer_decode.py
    --sweep` times these beside other one-token tiles."""
    if not fp8_dot_supported(device):
        return None
    if key_dtype == "mxfp4" and heads >= 64:
        return TiledConfig(1, 64, 4, 3, 1, mx_scoring="group_dots", prefetch=True, one_wave=True)
    if key_dtype == "mxfp4":
        return TiledConfig(1, 64, 4, 8, 1, mx_scoring="group_dots")
    return TiledConfig(1, 64, 4, 16, 1, prefetch=True) if heads >= 64 else TiledConfig(1, 128, 4, 8, 1)


@functools.cache  # asked at every indexer call; the capability query is a driver call
def fp8_dot_supported(device: torch.device) -> bool:
    """fp8 e4m3 tensor-core dots: NVIDIA compute capability 8.9 and later (Ada, Hopper, Blackwell)."""
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device) >= (8, 9)


def indexer_logits_tiled(q_fp8: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, key_dtype: str,
                         block_table: torch.Tensor, seq_ids: torch.Tensor, end: torch.Tensor, block_size: int,
                         n_cols: int, config: TiledConfig | None = None, mask_tail: bool = True,
                         fp8_dot: bool | None = None) -> torch.Tensor:
    """Launch the tiled kernel on prepared (contiguous, int32) paged inputs."""
    t, h, d = q_fp8.shape
    out = new_output((t, n_cols), torch.float32, q_fp8.device)
    if t == 0 or n_cols == 0:
        return out
    cfg = config or default_tiled_config(key_dtype, q_fp8.device)
    use_fp8 = fp8_dot_supported(q_fp8.device) if fp8_dot is None else fp8_dot
    tiles = triton.cdiv(t, cfg.block_m)
    # one wave: as many programs as the compiled kernel leaves resident (known from its first launch)
    variant = (q_fp8.device, h, d, key_dtype, cfg, use_fp8, mask_tail, block_size & -block_size)
    per_sm = _RESIDENT.get(variant, cfg.programs_per_sm) if cfg.one_wave else cfg.programs_per_sm
    grid = (tiles, row_programs(tiles, triton.cdiv(n_cols, cfg.block_n), q_fp8.device, per_sm, cfg.one_wave))
    compiled = _indexer_tiled_kernel[grid](
        q_fp8, weights, rows, rows.view(torch.int32), out,
        block_table, seq_ids, end,
        t, n_cols, block_table.stride(0), block_size,
        VALUE_WORDS=indexer_value_bytes(d, key_dtype) // 4, H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, RUN=math.gcd(cfg.block_n, block_size & -block_size),
        MXFP4=key_dtype == "mxfp4", MX_GROUP_DOTS=cfg.mx_scoring == "group_dots",
        FP8_DOT=use_fp8, MASK_TAIL=mask_tail,
        PREFETCH=cfg.prefetch,
        DOT_DTYPE=dot_dtype(q_fp8, tl.float16),
        num_warps=cfg.num_warps, **({} if cfg.num_stages is None else {"num_stages": cfg.num_stages}),
    )
    if cfg.one_wave and variant not in _RESIDENT:
        _RESIDENT[variant] = kernel_residency(compiled, q_fp8.device) or cfg.programs_per_sm
    return out


# programs an SM holds of each one-wave kernel variant, read from its first launch (kernel_residency):
# TiledConfig.programs_per_sm is the count on the GPU and compiler it was tuned for and stands until then
_RESIDENT: dict[tuple, int] = {}
