"""The Gluon kernel of sparse MLA for AMD CDNA3 (gfx942: MI300), the sm_90 kernel's counterpart where
Gluon's AMD backend differs: matrix-core (MFMA) layouts, 64-thread wavefronts, no wgmma, TMA,
mbarriers or warp specialisation. Written and compiled for gfx942; it has not run on AMD hardware.

One program per (token, block of 64 heads, split of the index list), four wavefronts, each owning
16 heads (the MFMA's M) across the whole tile: the query stays in registers as the MFMA's A
operand, the [64, d_c] fp32 accumulator in registers (AGPRs), and a tile of BLOCK_N rows goes
through the 64 KB of LDS, from which both products read it (K^T for the scores, V = the same rows
for the output). Software pipelining in registers: the next tile's rows (bf16, or fp8_ds_mla
bytes and scales, dequantised by integer bit placement since CDNA3's fp8 is the fnuz variant) are
loaded before the current tile is scored, and stored to LDS once its last reader is done.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.amd import AMDMFMALayout
from triton.experimental.gluon.language.amd.cdna3 import mfma

from kernels.sparse_mla_gluon import AMD_WAVEFRONTS
from kernels.sparse_mla_gluon import BLOCK_H as _BLOCK_H
from kernels.sparse_mla_gluon_common import (
    load_fp8_rows,
    load_slots,
    online_softmax,
    split_range,
    store_fp8_rows,
    store_result,
)

BLOCK_H = gl.constexpr(_BLOCK_H)  # heads per program: 16 rows per wavefront
WARPS = gl.constexpr(AMD_WAVEFRONTS)  # the launcher's num_warps
LANES = gl.constexpr(64)  # threads per wavefront
# a barrier across the program's wavefronts (renamed `barrier` after Triton 3.6)
_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier


@gluon.jit
def _load_bf16_rows(kv_ptr, slot, KV_STRIDE: gl.constexpr, D_C: gl.constexpr, D_R: gl.constexpr,
                    layout: gl.constexpr):
    """Registers of the bf16 rows at `slot` (zeros for -1): latent [BLOCK_N, D_C] and rope [BLOCK_N, D_R]."""
    valid = (slot >= 0)[:, None]
    base = kv_ptr + gl.where(slot >= 0, slot, 0).to(gl.int64)[:, None] * KV_STRIDE
    latent = gl.load(base + gl.arange(0, D_C, gl.SliceLayout(0, layout))[None, :], mask=valid, other=0.0)
    rope = gl.load(base + D_C + gl.arange(0, D_R, gl.SliceLayout(0, layout))[None, :], mask=valid, other=0.0)
    return latent, rope


@gluon.jit
def _load_query(q_ptr, stride_t, stride_h, t, h0, n_heads, D: gl.constexpr, layout: gl.constexpr,
                op_layout: gl.constexpr):
    """The program's query heads (zeros past n_heads) [BLOCK_H, D] as an MFMA operand."""
    heads = h0 + gl.arange(0, BLOCK_H, gl.SliceLayout(1, layout))
    ptrs = (q_ptr + t * stride_t + heads.to(gl.int64)[:, None] * stride_h
            + gl.arange(0, D, gl.SliceLayout(0, layout))[None, :])
    return gl.convert_layout(gl.load(ptrs, mask=(heads < n_heads)[:, None], other=0.0), op_layout)


@gluon.jit
def sparse_mla_fwd_amd_kernel(
    q_c_ptr, q_r_ptr, kv_ptr, kv_bytes_ptr, idx_ptr, o_ptr, lse_ptr,
    q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h, sm_scale_log2, n_idx, n_heads,
    KV_STRIDE: gl.constexpr, ROW_BYTES: gl.constexpr, ROPE_OFFSET: gl.constexpr,
    D_C: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, FP8: gl.constexpr, SPLIT: gl.constexpr,
):
    mma: gl.constexpr = AMDMFMALayout(version=3, instr_shape=[16, 16, 16], transposed=True,
                                      warps_per_cta=[WARPS, 1])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    # 8 threads of 16 bytes cover 64 bf16 columns; a wavefront covers 8 rows
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [LANES // 8, 8], [WARPS, 1], [1, 0])
    lds: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])

    head_blocks = gl.cdiv(n_heads, BLOCK_H)
    t = (gl.program_id(0) // head_blocks).to(gl.int64)
    h0 = (gl.program_id(0) % head_blocks) * BLOCK_H
    lo, hi = split_range(n_idx, BLOCK_N)
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    row_start = t * n_idx
    q_c = _load_query(q_c_ptr, q_c_stride_t, q_c_stride_h, t, h0, n_heads, D_C, rows, a_op)
    q_r = _load_query(q_r_ptr, q_r_stride_t, q_r_stride_h, t, h0, n_heads, D_R, rows, a_op)
    kc = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D_C], lds)
    kr = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D_R], lds)

    m = gl.full([BLOCK_H], -1e30, gl.float32, gl.SliceLayout(1, mma))
    l = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, mma))
    o = gl.zeros([BLOCK_H, D_C], gl.float32, mma)
    slot_rows: gl.constexpr = gl.SliceLayout(1, rows)
    slot = load_slots(idx_ptr, row_start, lo, hi, BLOCK_N, slot_rows)
    if FP8:
        raw, scales, rope = load_fp8_rows(kv_bytes_ptr, kv_ptr, slot, ROW_BYTES, ROPE_OFFSET, KV_STRIDE, D_C, D_R,
                                          WARPS, LANES)
    else:
        latent, rope = _load_bf16_rows(kv_ptr, slot, KV_STRIDE, D_C, D_R, rows)
    for j in range(n_tiles):
        valid = (load_slots(idx_ptr, row_start, lo + j * BLOCK_N, hi, BLOCK_N, gl.SliceLayout(0, mma)) >= 0)[None, :]
        _barrier()  # the previous tile's readers are done with the LDS
        if FP8:
            store_fp8_rows(raw, scales, rope, kc, kr, D_C, False)
        else:
            kc.store(latent)
            kr.store(rope)
        # the next tile's loads are in flight while this one is scored
        slot = load_slots(idx_ptr, row_start, lo + (j + 1) * BLOCK_N, hi, BLOCK_N, slot_rows)
        if FP8:
            raw, scales, rope = load_fp8_rows(kv_bytes_ptr, kv_ptr, slot, ROW_BYTES, ROPE_OFFSET, KV_STRIDE, D_C,
                                              D_R, WARPS, LANES)
        else:
            latent, rope = _load_bf16_rows(kv_ptr, slot, KV_STRIDE, D_C, D_R, rows)
        _barrier()
        s = mfma(q_c, kc.permute((1, 0)).load(b_op), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, mma))
        s = mfma(q_r, kr.permute((1, 0)).load(b_op), s)
        p, m, alpha = online_softmax(s, valid, m, sm_scale_log2)
        l = l * alpha + gl.sum(p, axis=1)
        o = mfma(gl.convert_layout(p.to(gl.bfloat16), a_op), kc.load(b_op), o * alpha[:, None])
    store_result(o, m, l, o_ptr, lse_ptr, t, h0, n_heads, D_C, SPLIT, mma)
