"""The quantisers as single Triton kernels, bit-identical to their torch references in quant.py.

fp8 e4m3 rows:
Each row of x[..., D] gets the power-of-two scale s = 2^ceil(log2(amax / 448)) (1 for an all-zero
row) and bytes e4m3(x / s), rounded to nearest even, exactly as `kernels.quant.fp8_e4m3_quantize`
computes them with torch (about 16 kernels: abs, amax, frexp, ldexp, where, division, clamp,
cast, ...). The indexer quantises its queries and keys with it in every layer, so in a decode
step this one launch replaces some 30 per layer. The e4m3 encode is integer arithmetic on the
fp32 bits (no hardware fp8 type), so it runs the same on CUDA, ROCm and the interpreter.
One difference from the reference: when amax / 448 is a subnormal fp32 (amax < 5e-36) the scale
is 2^-126, not the exact subnormal power of two.

MXFP4 rows: per 32 values the shared exponent floor(log2 amax) - 2 (clamped to the ue8m0 range)
and e2m1 codes rounded to nearest, ties to the even code, written straight into the indexer
cache row layout (nibbles, then one scale byte per group), as `kernels.quant.mxfp4_quantize`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import new_output

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def _pow2_ceil(r):
    """Smallest power of two >= r for r >= 0 (fp32), from the bits; subnormal r gives 2^-126."""
    bits = r.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    exact = (bits & 0x7FFFFF) == 0
    up = tl.where(exact, exponent, exponent + 1)
    return (tl.maximum(up, 1) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _encode_e4m3(v):
    """fp32 values with |v| <= 448 -> e4m3 bytes (int32 0..255), round to nearest even; NaN -> 0x7F | sign."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(v)
    # subnormal range (|v| < 2^-6): code = |v| * 2^9 rounded to nearest even (adding and removing
    # 2^23 rounds an fp32 in [0, 2^22) to an integer, ties to even); 8 is 2^-6's normal code.
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    abits = a.to(tl.int32, bitcast=True)
    mant = abits & 0x7FFFFF
    low = mant & 0xFFFFF  # the 20 bits below e4m3's 3 mantissa bits
    odd = (mant >> 20) & 1
    up = ((low > 0x80000) | ((low == 0x80000) & (odd == 1))).to(tl.int32)
    normal = ((((abits >> 23) & 0xFF) - 120) << 3) + (mant >> 20) + up  # exponent bias 127 -> 7
    code = tl.where(a < 0.015625, sub, normal)
    return tl.where(abits > 0x7F800000, 0x7F, code) | sign  # NaN: exponent all ones, mantissa not zero


@triton.jit
def _fp8_quantize_kernel(x_ptr, q_ptr, scale_ptr, n_rows, rows_per_group, group_stride, D: tl.constexpr,
                         BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, D)
    ok = rows < n_rows
    # x's rows come in groups of packed rows (a token's heads) a group stride apart; q is packed
    x_rows = (rows // rows_per_group).to(tl.int64) * group_stride + (rows % rows_per_group).to(tl.int64) * D
    x = tl.load(x_ptr + x_rows[:, None] + cols[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    codes, scale = fp8_rows(x)
    tl.store(q_ptr + offs, codes.to(tl.uint8), mask=ok[:, None])
    tl.store(scale_ptr + rows, scale, mask=ok)


@triton.jit
def fp8_rows(x):
    """fp32 rows x [R, D] -> (e4m3 codes int32 [R, D], power-of-two scales fp32 [R]), as the reference."""
    amax = tl.max(tl.abs(x), axis=1)
    ratio = tl.fdiv(amax, tl.full(amax.shape, E4M3_MAX, tl.float32), ieee_rounding=True)  # IEEE, as torch's
    scale = tl.where(amax > 0, _pow2_ceil(ratio), 1.0)
    # dividing by a power of two is exact (as the reference's division): multiply by its inverse
    inv = (254 - ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF)) << 23
    scaled = x * inv.to(tl.float32, bitcast=True)[:, None]
    scaled = tl.minimum(tl.maximum(scaled, -E4M3_MAX), E4M3_MAX)
    return _encode_e4m3(scaled), scale


def fp8_e4m3_quantize_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x[..., D] (D a power of two >= 16) -> (uint8[..., D], fp32 scale[...]), one launch. A
    [T, heads, D] view whose heads are packed but whose tokens are a wider stride apart (the
    indexer's query, a slice of a fused projection's rows) is read in place, without a copy."""
    d = x.shape[-1]
    lead = x.shape[:-1]
    if x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == d:
        rows, rows_per_group, group_stride = x, x.shape[1], x.stride(0)
    else:
        rows, rows_per_group, group_stride = x.contiguous(), 1, d
    n = x.numel() // d if d else 0
    q = new_output((n, d), torch.uint8, x.device)
    scale = new_output((n,), torch.float32, x.device)
    if n:
        block_r = max(1, min(64, 4096 // d))
        _fp8_quantize_kernel[(triton.cdiv(n, block_r),)](rows, q, scale, n, max(1, rows_per_group), group_stride,
                                                         D=d, BLOCK_R=block_r, num_warps=4)
    return q.reshape(*lead, d), scale.reshape(lead)


@triton.jit
def _e2m1_code(a):
    """Magnitudes in [0, 6] -> e2m1 codes 0..7: nearest value, ties to the even code (at the
    midpoints 0.75, 1.75 and 3.5 the lower code is odd, so a tie goes up)."""
    code = ((a > 0.25).to(tl.int32) + (a > 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) + (a > 1.75).to(tl.int32)
            + (a > 2.5).to(tl.int32) + (a > 3.5).to(tl.int32) + (a > 5.0).to(tl.int32))
    return code + ((a == 0.75) | (a == 1.75) | (a == 3.5)).to(tl.int32)


@triton.jit
def _mx_nibbles(v, inv):
    """Values of one parity [R, 16] times each group's inverse scale [R, 1] -> 4-bit codes."""
    scaled = v * inv
    sign = ((scaled.to(tl.int32, bitcast=True) >> 28) & 0x8)
    return _e2m1_code(tl.minimum(tl.abs(scaled), 6.0)) | sign


@triton.jit
def _mxfp4_quantize_kernel(x_ptr, out_ptr, n_groups, D: tl.constexpr, BLOCK_G: tl.constexpr):
    """One group of 32 values per row of the tile: amax, shared exponent, 16 packed bytes, scale byte."""
    groups = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    ok = groups < n_groups
    pair = tl.arange(0, 16)
    src = x_ptr + groups.to(tl.int64)[:, None] * 32 + 2 * pair[None, :]
    even = tl.load(src, mask=ok[:, None], other=0.0).to(tl.float32)
    odd = tl.load(src + 1, mask=ok[:, None], other=0.0).to(tl.float32)
    row_bytes: tl.constexpr = D // 2 + D // 32
    row = groups // (D // 32)
    row_ptr = out_ptr + row.to(tl.int64) * row_bytes
    store_mxfp4_groups(row_ptr, row_ptr + D // 2, groups % (D // 32), even, odd, ok)


@triton.jit
def store_mxfp4_groups(values_ptr, scales_ptr, g, even, odd, ok):
    """Encode groups of 32 values, given as their even and odd elements [G, 16] (fp32), and store
    them as group g [G] of the keys whose nibbles start at values_ptr [G] and scale bytes at
    scales_ptr [G]: 16 bytes of nibbles at values_ptr + 16 g, the ue8m0 scale byte at scales_ptr + g."""
    amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))
    # frexp's exponent of amax is its biased fp32 exponent - 126; the shared exponent is that - 3
    shared = tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 129, -126), 127)
    inv = ((127 - shared) << 23).to(tl.float32, bitcast=True)[:, None]  # 2^-shared, exact
    packed = _mx_nibbles(even, inv) | (_mx_nibbles(odd, inv) << 4)
    pair = tl.arange(0, 16)
    tl.store(values_ptr[:, None] + 16 * g[:, None] + pair[None, :], packed.to(tl.uint8), mask=ok[:, None])
    tl.store(scales_ptr + g, (shared + 127).to(tl.uint8), mask=ok)


def mxfp4_quantize_triton(x: torch.Tensor) -> torch.Tensor:
    """x[..., D] (D a multiple of 32) -> uint8[..., D/2 + D/32], one launch."""
    d = x.shape[-1]
    lead = x.shape[:-1]
    flat = x.reshape(-1, d).contiguous()
    out = new_output((flat.shape[0], d // 2 + d // 32), torch.uint8, x.device)
    n_groups = flat.shape[0] * (d // 32)
    if n_groups:
        block_g = 64
        _mxfp4_quantize_kernel[(triton.cdiv(n_groups, block_g),)](flat, out, n_groups, D=d, BLOCK_G=block_g,
                                                                  num_warps=4)
    return out.reshape(*lead, d // 2 + d // 32)


@triton.jit
def key_words(block, offset, block_size, VALUE_WORDS: tl.constexpr):
    """(first value word, scale word) of the keys at offset [any shape] of cache blocks block (int64),
    as int32-word indices of the indexer key cache: a block holds its block_size keys' values,
    VALUE_WORDS words each, then their scale words (kernels/quant.py's layout)."""
    base = block * block_size * (VALUE_WORDS + 1)
    return base + offset * VALUE_WORDS, base + block_size * VALUE_WORDS + offset
