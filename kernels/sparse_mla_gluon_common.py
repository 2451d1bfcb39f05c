"""Device code of the Gluon sparse-MLA kernels that does not depend on the GPU family: the split of
the index list, index loads, fp8_ds_mla rows into registers and as bf16 into shared memory, the
online-softmax step and the normalised store (kernels/sparse_mla_gluon_kernel.py for Hopper,
kernels/sparse_mla_gluon_amd.py for CDNA3). Layouts come from the caller; the fp8 row loads
take its warp count and warp size."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def split_range(n_idx, BLOCK_N: gl.constexpr):
    """This program's [lo, hi) of the index list: splits take whole tiles of BLOCK_N."""
    per_split = gl.cdiv(gl.cdiv(n_idx, BLOCK_N), gl.num_programs(1)) * BLOCK_N
    lo = gl.program_id(1) * per_split
    return lo, gl.minimum(lo + per_split, n_idx)


@gluon.jit
def load_slots(idx_ptr, row_start, pos0, hi, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Cache slots of the tile starting at index position pos0 ([BLOCK_N] in `layout`; -1: none)."""
    pos = pos0 + gl.arange(0, BLOCK_N, layout)
    return gl.load(idx_ptr + row_start + pos, mask=pos < hi, other=-1)


@gluon.jit
def load_fp8_rows(kv_bytes_ptr, kv_ptr, slot, ROW_BYTES: gl.constexpr, ROPE_OFFSET: gl.constexpr,
                  KV_STRIDE: gl.constexpr, D_C: gl.constexpr, D_R: gl.constexpr, WARPS: gl.constexpr,
                  LANES: gl.constexpr):
    """Registers of the fp8_ds_mla rows at `slot` (zeros for -1), loaded by WARPS warps of LANES
    threads: the latent e4m3 bytes as [BLOCK_N, groups, 128], the groups' fp32 scales
    [BLOCK_N, groups] and the bf16 rope [BLOCK_N, D_R]."""
    GROUPS: gl.constexpr = D_C // 128
    # 8 threads of 16 bytes cover a 128-value group; a warp covers LANES / 8 rows
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [LANES // 8, 1, 8], [WARPS, 1, 1], [2, 1, 0])
    rows3: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, l3))
    slot3 = gl.convert_layout(slot, rows3)
    valid3 = slot3 >= 0
    row3 = gl.where(valid3, slot3, 0).to(gl.int64) * ROW_BYTES
    groups = gl.arange(0, GROUPS, gl.SliceLayout(0, gl.SliceLayout(2, l3)))
    values = gl.arange(0, 128, gl.SliceLayout(0, gl.SliceLayout(1, l3)))
    byte = row3[:, None, None] + (groups * 128)[None, :, None] + values[None, None, :]
    raw = gl.load(kv_bytes_ptr + byte, mask=valid3[:, None, None], other=0)
    scale_ptr = (kv_bytes_ptr + row3[:, None] + D_C + groups[None, :] * 4).to(gl.pointer_type(gl.float32),
                                                                               bitcast=True)
    scales = gl.load(scale_ptr, mask=valid3[:, None], other=0.0)
    l2: gl.constexpr = gl.BlockedLayout([1, 8], [LANES // 8, 8], [WARPS, 1], [1, 0])
    slot2 = gl.convert_layout(slot, gl.SliceLayout(1, l2))
    valid2 = slot2 >= 0
    rope_ptr = (kv_ptr + gl.where(valid2, slot2, 0).to(gl.int64)[:, None] * KV_STRIDE + ROPE_OFFSET
                + gl.arange(0, D_R, gl.SliceLayout(0, l2))[None, :])
    rope = gl.load(rope_ptr, mask=valid2[:, None], other=0.0)
    return raw, scales, rope


@gluon.jit
def store_fp8_rows(raw, scales, rope, kc, kr, D_C: gl.constexpr, HARDWARE_E4M3: gl.constexpr):
    """Dequantise the latent bytes (value x its group's scale, exact in bf16 for power-of-two scales)
    and store them and the rope to the shared-memory buffers kc [BLOCK_N, D_C] and kr [BLOCK_N, D_R]."""
    latent = e4m3_to_f32(raw, HARDWARE_E4M3) * scales[:, :, None]
    kc.store(gl.reshape(latent.to(gl.bfloat16), [raw.shape[0], D_C]))
    kr.store(rope)


@gluon.jit
def e4m3_to_f32(raw, HARDWARE: gl.constexpr):
    """e4m3 (OCP) bytes -> fp32: by Hopper's conversion, or (CDNA3, whose native fp8 is the fnuz
    variant) by placing the bits in an fp16 (exponent bias 15 against 7: the value / 2^8), as
    kernels/triton_utils.py's e4m3_to_raw_f16; 0x7F / 0xFF are NaN either way."""
    if HARDWARE:
        return raw.to(gl.float8e4nv, bitcast=True).to(gl.float32)
    b = raw.to(gl.int32)
    value = (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    return gl.where((b & 0x7F) == 0x7F, float("nan"), value * 256.0)


@gluon.jit
def online_softmax(s, valid, m, sm_scale_log2):
    """One tile's step of the exp2 online softmax over scores s [BLOCK_H, BLOCK_N] whose columns are
    `valid` [1, BLOCK_N] (others -1e30, never -inf, so nothing becomes NaN): (p, the new running
    max, the factor alpha that rescales what was accumulated under the old one)."""
    scores = gl.where(valid, s * sm_scale_log2, -1e30)
    m_new = gl.maximum(m, gl.max(scores, axis=1))
    p = gl.where(valid, gl.exp2(scores - m_new[:, None]), 0.0)
    return p, m_new, gl.exp2(m - m_new)


@gluon.jit
def store_result(o, m, l, o_ptr, lse_ptr, t, h0, n_heads, D_C: gl.constexpr, SPLIT: gl.constexpr,
                 o_layout: gl.constexpr):
    """Normalise and store o [BLOCK_H, D_C] and lse, or the split's partials (o fp32, lse in log2)."""
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    heads = h0 + gl.arange(0, o.shape[0], row_layout)
    head_ok = heads < n_heads
    cols = gl.arange(0, D_C, gl.SliceLayout(0, o_layout))[None, :]
    l = gl.convert_layout(l, row_layout)
    m = gl.convert_layout(m, row_layout)
    has_any = l > 0
    safe_l = gl.where(has_any, l, 1.0)
    out = o / safe_l[:, None]
    lse_log2 = gl.where(has_any, m + gl.log2(safe_l), float("-inf"))
    if SPLIT:  # partials: o fp32 [T, H, S, D_C], lse (log2) [T, H, S]
        part = (t * n_heads + heads) * gl.num_programs(1) + gl.program_id(1)
        gl.store(o_ptr + part[:, None] * D_C + cols, out, mask=head_ok[:, None])
        gl.store(lse_ptr + part, lse_log2, mask=head_ok)
    else:
        row = t * n_heads + heads
        gl.store(o_ptr + row[:, None] * D_C + cols, out.to(gl.bfloat16), mask=head_ok[:, None])
        gl.store(lse_ptr + row, lse_log2 / LOG2E, mask=head_ok)
