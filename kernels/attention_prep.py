"""A layer's attention inputs prepared in two kernels: norms, rotations, quantisation, cache writes.

Between a layer's projections and its attention kernels each token needs a dozen small steps.
As torch ops (kernels/quant.py's writers, the norms, `rope_reference`'s rotation) they are 13 launches per
layer; at decode sizes each costs a few microseconds whatever its work, so here they are two:
- `mla_prepare_`: the query's rotary part rotated in place (MLA's interleaved pairs), and the
  token's KV cache row written at its slot: RMSNorm of the latent, the rotated key part, in the
  cache's layout (bf16, or fp8_ds_mla's e4m3 groups with their scales);
- `indexer_prepare`: the indexer key's LayerNorm and rotation (halves form) written to the
  indexer cache (fp8 e4m3 with its scale, or MXFP4), and the query's heads rotated and quantised
  to e4m3 with each head's logit weight folded with its scale.
Intermediate values are rounded to bf16 where the torch path holds them in the model's dtype, so
the bytes match the references' but for the last bit of a rounding now and then (fp32 sums in
another order); the tests compare dequantised values.

Grid: one row of programs per token: program 0 writes the cache row, the others take blocks of
the query's heads. The functions' "torch" backend is the reference: the separate ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.quant import (
    DS_MLA_GROUP,
    fp8_e4m3_quantize,
    indexer_cache_block_size,
    kv_row_width,
    write_indexer_cache,
    write_kv_cache,
)
from kernels.quant_kernels import fp8_rows, store_mxfp4_groups
from kernels.triton_utils import f32_to_bf16, new_output, round_to

BLOCK_HEADS = 16  # query heads per program


@triton.jit
def _rotate_pairs_(base, cos, sin, ok, HALF: tl.constexpr, TO_BF16: tl.constexpr):
    """Rotate in place the interleaved pairs (x0, x1), (x2, x3), ... of the rows starting at base
    [R, 1] (masked by ok [R, 1]) by cos, sin [1, HALF]. Each thread reads and writes the same
    pairs, so the rotation in place needs no barrier."""
    i = tl.arange(0, HALF)
    a = tl.load(base + (2 * i)[None, :], mask=ok, other=0.0).to(tl.float32)
    b = tl.load(base + (2 * i + 1)[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(base + (2 * i)[None, :], round_to(a * cos - b * sin, TO_BF16).to(base.dtype.element_ty), mask=ok)
    tl.store(base + (2 * i + 1)[None, :], round_to(a * sin + b * cos, TO_BF16).to(base.dtype.element_ty), mask=ok)


@triton.jit
def _normed(row_ptr, cols, mask, mean, rstd, w_ptr, b_ptr, NORM: tl.constexpr, TO_BF16: tl.constexpr):
    """Elements cols of a row, LayerNorm'ed ((x - mean) * rstd * w + b) and rounded when NORM."""
    x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        x = round_to((x - mean) * rstd * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                     + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32), TO_BF16)
    return x


@triton.jit
def _rotated(row_ptr, cols, valid, cos_ptr, sin_ptr, mean, rstd, w_ptr, b_ptr, HALF: tl.constexpr,
             INTERLEAVED: tl.constexpr, NORM: tl.constexpr, TO_BF16: tl.constexpr):
    """Elements cols (any shape; where valid) of a row after the optional LayerNorm and the rotation
    of its first 2 HALF elements. Each element reads its pair's partner itself, so the result must
    go elsewhere than the row (another thread may still read what this one would overwrite)."""
    in_rope = valid & (cols < 2 * HALF)
    if INTERLEAVED:
        first = cols % 2 == 0
        partner = cols ^ 1
        angle = cols // 2
    else:
        first = cols < HALF
        partner = tl.where(first, cols + HALF, cols - HALF)
        angle = tl.where(first, cols, cols - HALF)
    own = _normed(row_ptr, cols, valid, mean, rstd, w_ptr, b_ptr, NORM, TO_BF16)
    other = _normed(row_ptr, partner, in_rope, mean, rstd, w_ptr, b_ptr, NORM, TO_BF16)
    cos = tl.load(cos_ptr + angle, mask=in_rope, other=1.0)
    sin = tl.load(sin_ptr + angle, mask=in_rope, other=0.0)
    rotated = round_to(tl.where(first, own * cos - other * sin, other * sin + own * cos), TO_BF16)
    return tl.where(in_rope, rotated, own)


@triton.jit
def _mla_prepare_kernel(q_pe_ptr, latent_ptr, k_pe_ptr, norm_w_ptr, cos_ptr, sin_ptr, slots_ptr, cache_ptr,
                        n_heads, q_stride_t, q_stride_h, latent_stride_t, k_pe_stride_t, eps,
                        D_C: tl.constexpr, D_R: tl.constexpr, ROW: tl.constexpr, FP8: tl.constexpr,
                        GROUP: tl.constexpr, TO_BF16: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = D_R // 2
    if tl.program_id(1) > 0:  # a block of the query's heads, rotated in place
        i = tl.arange(0, half)
        heads = (tl.program_id(1) - 1) * BLOCK_H + tl.arange(0, BLOCK_H)
        base = q_pe_ptr + t * q_stride_t + heads.to(tl.int64)[:, None] * q_stride_h
        _rotate_pairs_(base, tl.load(cos_ptr + t * half + i)[None, :], tl.load(sin_ptr + t * half + i)[None, :],
                       (heads < n_heads)[:, None], half, TO_BF16)
    else:  # the cache row: [RMSNorm(latent) ; rotated k_pe]
        cols_c = tl.arange(0, D_C)
        x = tl.load(latent_ptr + t * latent_stride_t + cols_c).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D_C + eps)
        c = round_to(x * rstd * tl.load(norm_w_ptr + cols_c).to(tl.float32), TO_BF16)
        cols_r = tl.arange(0, D_R)
        k_pe = _rotated(k_pe_ptr + t * k_pe_stride_t, cols_r, cols_r >= 0, cos_ptr + t * half, sin_ptr + t * half,
                        0.0, 1.0, norm_w_ptr, norm_w_ptr, half, True, False, TO_BF16)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        if FP8:  # e4m3 groups of DS_MLA_GROUP values, their fp32 scales, then the rope part in bf16
            groups: tl.constexpr = D_C // GROUP
            codes, scale = fp8_rows(tl.reshape(c, (groups, GROUP)))
            row = cache_ptr + slot * ROW
            tl.store(row + cols_c, tl.reshape(codes, (D_C,)).to(tl.uint8))
            tl.store((row + D_C).to(tl.pointer_type(tl.float32)) + tl.arange(0, groups), scale)
            tl.store((row + D_C + 4 * groups).to(tl.pointer_type(tl.bfloat16)) + cols_r, f32_to_bf16(k_pe))
        else:  # rounded to nearest by bit arithmetic: an fp32 model's values too (the interpreter's cast truncates)
            row = cache_ptr + slot * (D_C + D_R)
            tl.store(row + cols_c, f32_to_bf16(c))
            tl.store(row + D_C + cols_r, f32_to_bf16(k_pe))


@triton.jit
def _indexer_prepare_kernel(q_ptr, key_ptr, hw_ptr, ln_w_ptr, ln_b_ptr, cos_ptr, sin_ptr, slots_ptr, cache_ptr,
                            q8_ptr, weights_ptr, n_heads, q_stride_t, q_stride_h, key_stride_t, hw_stride_t,
                            eps, weight_scale, block_size, D: tl.constexpr, D_R: tl.constexpr, MXFP4: tl.constexpr,
                            TO_BF16: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = D_R // 2
    cos_row, sin_row = cos_ptr + t * half, sin_ptr + t * half
    if tl.program_id(1) > 0:  # a block of query heads: rotated, e4m3 per head, weight times scale
        heads = (tl.program_id(1) - 1) * BLOCK_H + tl.arange(0, BLOCK_H)
        ok = heads < n_heads
        cols = tl.arange(0, D)[None, :] + tl.zeros((BLOCK_H, 1), tl.int32)
        base = q_ptr + t * q_stride_t + heads.to(tl.int64)[:, None] * q_stride_h
        q = _rotated(base, cols, ok[:, None], cos_row, sin_row, 0.0, 1.0, ln_w_ptr, ln_b_ptr,
                     half, False, False, TO_BF16)
        codes, scale = fp8_rows(q)
        out = (t * n_heads + heads)
        tl.store(q8_ptr + out[:, None] * D + cols, codes.to(tl.uint8), mask=ok[:, None])
        hw = tl.load(hw_ptr + t * hw_stride_t + heads, mask=ok, other=0.0).to(tl.float32)
        tl.store(weights_ptr + out, hw * scale * weight_scale, mask=ok)
    else:  # the key: LayerNorm, rotation, into the indexer cache at the token's slot (its names differ from
        # the other branch's: triton wants a name bound in both branches of an if to keep its type)
        row = key_ptr + t * key_stride_t
        x = tl.load(row + tl.arange(0, D)).to(tl.float32)
        mean = tl.sum(x, axis=0) / D
        rstd = 1.0 / tl.sqrt(tl.sum((x - mean) * (x - mean), axis=0) / D + eps)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        # the key's values and its scale word in its cache block (kernels/quant.py's layout)
        value_bytes: tl.constexpr = D // 2 if MXFP4 else D
        block_base = cache_ptr + (slot // block_size) * block_size * (value_bytes + 4)
        values_dst = block_base + (slot % block_size) * value_bytes
        scale_dst = block_base + block_size * value_bytes + (slot % block_size) * 4
        if MXFP4:  # each group's even and odd elements, as the quantiser packs them
            g = tl.arange(0, D // 32)
            even_cols = g[:, None] * 32 + 2 * tl.arange(0, 16)[None, :]
            even = _rotated(row, even_cols, even_cols >= 0, cos_row, sin_row, mean, rstd, ln_w_ptr, ln_b_ptr, half,
                            False, True, TO_BF16)
            odd = _rotated(row, even_cols + 1, even_cols >= 0, cos_row, sin_row, mean, rstd, ln_w_ptr, ln_b_ptr,
                           half, False, True, TO_BF16)
            lanes = tl.zeros((D // 32,), tl.int64)
            store_mxfp4_groups(values_dst + lanes, scale_dst + lanes, g, even, odd, g >= 0)
            if D < 128:  # the scale word's bytes past the key's groups: zero, as the torch writer leaves them
                pad = tl.arange(0, 4)
                tl.store(scale_dst + pad, tl.zeros((4,), tl.uint8), mask=pad >= D // 32)
        else:  # D e4m3 bytes, then the fp32 scale
            key_cols = tl.arange(0, D)[None, :]
            k = _rotated(row, key_cols, key_cols >= 0, cos_row, sin_row, mean, rstd, ln_w_ptr, ln_b_ptr, half, False,
                         True, TO_BF16)
            key_codes, key_scale = fp8_rows(k)
            tl.store(values_dst + key_cols, key_codes.to(tl.uint8))
            tl.store(scale_dst.to(tl.pointer_type(tl.float32)) + tl.arange(0, 1), key_scale)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, heads, dim] rotated by cos, sin fp32 [T, 1, dim/2] (interleaved pairs, or halves);
    same dtype out."""
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = xf.chunk(2, dim=-1)
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.to(x.dtype)


def _rows_of(x: torch.Tensor, name: str, caller: str) -> None:
    if x.stride(-1) != 1:
        raise ValueError(f"{caller}: {name} {tuple(x.shape)} needs a contiguous last dim")


def mla_prepare_reference(q_pe: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor, norm_weight: torch.Tensor,
                          eps: float, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                          slots: torch.Tensor, kv_dtype: str) -> None:
    q_pe.copy_(rope_reference(q_pe, cos, sin, interleaved=True))
    k_rot = rope_reference(k_pe[:, None], cos, sin, interleaved=True)[:, 0]
    write_kv_cache(kv_cache, slots, F.rms_norm(latent, (latent.shape[-1],), norm_weight, eps), k_rot, kv_dtype)


def mla_prepare_(q_pe: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
                 kv_dtype: str, backend: str | None = None) -> None:
    """Rotate q_pe [T, H, d_r] in place (interleaved pairs) and write each token's KV cache row at
    slots [T]: [RMSNorm(latent [T, d_c]) * norm_weight ; k_pe [T, d_r] rotated] in kv_dtype's
    layout. cos, sin: fp32 [T, 1, d_r/2]. Inputs may be views of wider rows (contiguous last dim)."""
    t, heads, d_r = q_pe.shape
    d_c = latent.shape[-1]
    if latent.shape != (t, d_c) or k_pe.shape != (t, d_r) or slots.shape != (t,):
        raise ValueError(f"mla_prepare_: q_pe [T, H, d_r], latent [T, d_c], k_pe [T, d_r] and slots [T] expected, "
                         f"got {list(q_pe.shape)}, {list(latent.shape)}, {list(k_pe.shape)}, {list(slots.shape)}")
    pow2 = d_c & (d_c - 1) == 0 and d_r & (d_r - 1) == 0
    if resolve_backend(backend, q_pe.device) == "torch" or not pow2 or (kv_dtype != "bf16" and d_c % DS_MLA_GROUP):
        mla_prepare_reference(q_pe, latent, k_pe, norm_weight, eps, cos, sin, kv_cache, slots, kv_dtype)
        return
    for x, name in ((q_pe, "q_pe"), (latent, "latent"), (k_pe, "k_pe")):
        _rows_of(x, name, "mla_prepare_")
    width = kv_row_width(d_c, d_r, kv_dtype)
    if kv_cache.dim() != 2 or kv_cache.shape[1] != width:
        raise ValueError(f"mla_prepare_: kv_cache must be [num_slots, {width}] for {kv_dtype}, "
                         f"got {list(kv_cache.shape)}")
    if t == 0:
        return
    _mla_prepare_kernel[(t, 1 + triton.cdiv(heads, BLOCK_HEADS))](
        q_pe, latent, k_pe, norm_weight, cos.reshape(t, d_r // 2).contiguous(), sin.reshape(t, d_r // 2).contiguous(),
        slots.contiguous(), kv_cache, heads, q_pe.stride(0), q_pe.stride(1), latent.stride(0), k_pe.stride(0), eps,
        D_C=d_c, D_R=d_r, ROW=kv_cache.shape[1], FP8=kv_dtype == "fp8_ds_mla", GROUP=DS_MLA_GROUP,
        TO_BF16=q_pe.dtype == torch.bfloat16, BLOCK_H=BLOCK_HEADS, num_warps=4)


def indexer_prepare_reference(q: torch.Tensor, key: torch.Tensor, head_weights: torch.Tensor,
                              norm_weight: torch.Tensor, norm_bias: torch.Tensor, eps: float, cos: torch.Tensor,
                              sin: torch.Tensor, rope_dim: int, idx_cache: torch.Tensor, slots: torch.Tensor,
                              key_dtype: str, weight_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    k = F.layer_norm(key, (key.shape[-1],), norm_weight, norm_bias, eps)
    k = torch.cat((rope_reference(k[:, None, :rope_dim], cos, sin, False)[:, 0], k[:, rope_dim:]), dim=-1)
    q = torch.cat((rope_reference(q[..., :rope_dim], cos, sin, False), q[..., rope_dim:]), dim=-1)
    write_indexer_cache(idx_cache, slots, k, key_dtype)
    q8, q_scale = fp8_e4m3_quantize(q, backend="torch")
    return q8, head_weights.float() * q_scale * weight_scale


def indexer_prepare(q: torch.Tensor, key: torch.Tensor, head_weights: torch.Tensor, norm_weight: torch.Tensor,
                    norm_bias: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int,
                    idx_cache: torch.Tensor, slots: torch.Tensor, key_dtype: str, weight_scale: float,
                    backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer's inputs of T tokens: writes each key [T, d_I], LayerNorm'ed (norm_weight,
    norm_bias, eps) and its first
    rope_dim values rotated (halves form), to the indexer cache at slots [T]; returns the query
    [T, H, d_I] rotated the same way as e4m3 bytes uint8 [T, H, d_I], and the logit weights
    fp32 [T, H] = head_weights * the query's per-head scale * weight_scale."""
    t, heads, d = q.shape
    if key.shape != (t, d) or head_weights.shape != (t, heads) or slots.shape != (t,):
        raise ValueError(f"indexer_prepare: q [T, H, d_I], key [T, d_I], head_weights [T, H] and slots [T] expected, "
                         f"got {list(q.shape)}, {list(key.shape)}, {list(head_weights.shape)}, {list(slots.shape)}")
    if resolve_backend(backend, q.device) == "torch" or d & (d - 1) or rope_dim & (rope_dim - 1) or d < 32:
        return indexer_prepare_reference(q, key, head_weights, norm_weight, norm_bias, eps, cos, sin, rope_dim,
                                         idx_cache, slots, key_dtype, weight_scale)
    for x, name in ((q, "q"), (key, "key"), (head_weights, "head_weights")):
        _rows_of(x, name, "indexer_prepare")
    block_size = indexer_cache_block_size(idx_cache, d, key_dtype, "indexer_prepare: idx_cache")
    q8 = new_output((t, heads, d), torch.uint8, q.device)
    weights = new_output((t, heads), torch.float32, q.device)
    if t:
        half = rope_dim // 2
        _indexer_prepare_kernel[(t, 1 + triton.cdiv(heads, BLOCK_HEADS))](
            q, key, head_weights, norm_weight, norm_bias, cos.reshape(t, half).contiguous(),
            sin.reshape(t, half).contiguous(), slots.contiguous(), idx_cache, q8, weights, heads, q.stride(0),
            q.stride(1), key.stride(0), head_weights.stride(0), eps, weight_scale, block_size, D=d, D_R=rope_dim,
            MXFP4=key_dtype == "mxfp4", TO_BF16=q.dtype == torch.bfloat16, BLOCK_H=BLOCK_HEADS, num_warps=4)
    return q8, weights
