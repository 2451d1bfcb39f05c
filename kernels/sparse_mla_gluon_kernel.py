"""The Gluon kernel of sparse MLA for Hopper (sm_90): a loader partition gathers the selected cache
rows into a shared-memory ring, the consumer partition scores them with wgmma and runs the softmax.

One program per (token, block of 64 heads, split of the index list), as kernels/sparse_mla.py's
Triton kernel, whose partial-output format (fp32 o, log2 lse) and combine kernel it shares. The
heads are the MMA's M dimension: one warpgroup holds 64 rows, so fewer heads are padded to 64 (the
padded rows are zero queries whose outputs are not stored). Two consumer warpgroups split each MMA
along N: the scores' columns (rows of the tile) for Q K^T and the latent columns for P V, so each
holds half of the [64, d_c] fp32 accumulator.

The loader (LOADER_WARPS warps, few registers) loads each tile's indices a tile ahead and gathers
its rows into a ring slot once the slot is free: bf16 rows by cp.async straight into the slot (rows
whose index is -1 are zero-filled), each thread's copies arriving on the slot's `ready` barrier when
they land; fp8 rows (kernels/quant.py's fp8_ds_mla layout) into registers before it waits for the
slot, then dequantised to bf16 (the scales are powers of two, so exactly) and stored to it, then
one arrival. The consumer waits on
`ready`, issues S = Q_c K_c^T + Q_r K_r^T asynchronously, and while it runs nothing else is
pending; the P V of the previous tile is issued after the softmax and runs under the next tile's
index load, barrier wait and score MMA. A slot is released (`free`) once the P V that read it has
completed, which the wait on the next tile's scores implies.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from kernels.sparse_mla_gluon import BLOCK_H as _BLOCK_H
from kernels.sparse_mla_gluon import CONSUMER_WARPS as _CONSUMER_WARPS
from kernels.sparse_mla_gluon_common import (
    load_fp8_rows,
    load_slots,
    online_softmax,
    split_range,
    store_fp8_rows,
    store_result,
)

BLOCK_H = gl.constexpr(_BLOCK_H)  # heads per program: one wgmma M tile
CHUNK = gl.constexpr(64)  # columns a gather step covers (128 B of bf16: one swizzle row)
CONSUMER_WARPS = gl.constexpr(_CONSUMER_WARPS)  # the launcher's num_warps
# names that changed after Triton 3.6 (torch 2.11's); the kernel compiles under both spellings
_partition_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier  # the partition's warps
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _gather_bf16(kv_ptr, slot, kc, kr, KV_STRIDE: gl.constexpr, D_C: gl.constexpr, D_R: gl.constexpr,
                 layout: gl.constexpr):
    """cp.async of the rows at `slot` into the slot buffers kc [BLOCK_N, D_C] and kr [BLOCK_N, D_R]."""
    valid = slot >= 0
    base = kv_ptr + gl.where(valid, slot, 0).to(gl.int64)[:, None] * KV_STRIDE
    cols = gl.arange(0, CHUNK, gl.SliceLayout(0, layout))[None, :]
    for c in gl.static_range(D_C // CHUNK):
        _cp_async(kc.slice(c * CHUNK, CHUNK, dim=1), base + (c * CHUNK + cols),
                                               mask=valid[:, None])
    for c in gl.static_range(D_R // CHUNK):
        _cp_async(kr.slice(c * CHUNK, CHUNK, dim=1), base + (D_C + c * CHUNK + cols),
                                               mask=valid[:, None])


@gluon.jit
def _loader(kv_ptr, kv_bytes_ptr, idx_ptr, kc_ring, kr_ring, ready, free, row_start, lo, hi, n_tiles,
            KV_STRIDE: gl.constexpr, ROW_BYTES: gl.constexpr, ROPE_OFFSET: gl.constexpr, D_C: gl.constexpr,
            D_R: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, FP8: gl.constexpr,
            LOADER_WARPS: gl.constexpr):
    # 8 threads of 16 bytes cover a 64-column chunk of a bf16 row; a warp covers 4 rows
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LOADER_WARPS, 1], [1, 0])
    slot_layout: gl.constexpr = gl.SliceLayout(1, layout)
    next_slot = load_slots(idx_ptr, row_start, lo, hi, BLOCK_N, slot_layout)
    for j in range(n_tiles):
        stage = j % NUM_STAGES
        slot = next_slot
        next_slot = load_slots(idx_ptr, row_start, lo + (j + 1) * BLOCK_N, hi, BLOCK_N, slot_layout)
        # a fresh barrier's phase "before 0" counts as complete: the first lap waits on nothing
        free_phase = ((j // NUM_STAGES) & 1) ^ 1
        if FP8:
            # the loads are in flight while the slot is still being read
            raw, scales, rope = load_fp8_rows(kv_bytes_ptr, kv_ptr, slot, ROW_BYTES, ROPE_OFFSET, KV_STRIDE, D_C,
                                              D_R, LOADER_WARPS, 32)
            mbarrier.wait(free.index(stage), free_phase)
            store_fp8_rows(raw, scales, rope, kc_ring.index(stage), kr_ring.index(stage), D_C, True)
            fence_async_shared()  # the stores above are read by wgmma (the async proxy)
            _partition_barrier()  # every loader thread has stored before the one arrival
            mbarrier.arrive(ready.index(stage), count=1)
        else:
            mbarrier.wait(free.index(stage), free_phase)
            _gather_bf16(kv_ptr, slot, kc_ring.index(stage), kr_ring.index(stage), KV_STRIDE, D_C, D_R, layout)
            async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)


@gluon.jit
def _consumer(q_c_ptr, q_r_ptr, idx_ptr, o_ptr, lse_ptr, qc_smem, qr_smem, p_smem, kc_ring, kr_ring, ready, free,
              q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h, sm_scale_log2, n_heads,
              t, h0, row_start, lo, hi, n_tiles,
              D_C: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
              SPLIT: gl.constexpr):
    # two warpgroups split N: score columns for Q K^T, latent columns for P V
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, D_C // 2, 16])
    _load_query(q_c_ptr, q_r_ptr, qc_smem, qr_smem, q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h,
                t, h0, n_heads, D_C, D_R)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    m = gl.full([BLOCK_H], -1e30, gl.float32, row_s)
    # the softmax denominators' terms, summed over the row once at the end: a row sum per tile would
    # cross the two warpgroups (through shared memory and two barriers) every tile
    l_terms = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    o = warpgroup_mma_init(gl.zeros([BLOCK_H, D_C], gl.float32, o_layout))
    # the last tile's scores are the (ignored) input of the next score MMA: their registers are
    # defined before the P V in flight, where fresh zeros would be written while it runs
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    gl.assume(n_tiles > 0)
    for j in range(n_tiles):
        stage = j % NUM_STAGES
        slot = load_slots(idx_ptr, row_start, lo + j * BLOCK_N, hi, BLOCK_N, gl.SliceLayout(0, s_layout))
        valid = (slot >= 0)[None, :]
        mbarrier.wait(ready.index(stage), (j // NUM_STAGES) & 1)
        # cp.async wrote the slot through the generic proxy; wgmma reads it through the async one
        fence_async_shared()
        kc = kc_ring.index(stage)
        s = warpgroup_mma(qc_smem, kc.permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma(qr_smem, kr_ring.index(stage).permute((1, 0)), s, is_async=True)
        s, o = warpgroup_mma_wait(0, deps=(s, o))
        # both warpgroups are past the previous tile's P V: its slot may be refilled
        _partition_barrier()
        mbarrier.arrive(free.index((j + NUM_STAGES - 1) % NUM_STAGES), count=1, pred=j > 0)
        p, m, alpha = online_softmax(s, valid, m, sm_scale_log2)
        l_terms = l_terms * alpha[:, None] + p
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        _partition_barrier()  # all of P is in shared memory before either warpgroup's MMA reads it
        o = warpgroup_mma(p_smem, kc, o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o,))
    store_result(o, m, gl.sum(l_terms, axis=1), o_ptr, lse_ptr, t, h0, n_heads, D_C, SPLIT, o_layout)


@gluon.jit
def _load_query(q_c_ptr, q_r_ptr, qc_smem, qr_smem, q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h,
                t, h0, n_heads, D_C: gl.constexpr, D_R: gl.constexpr):
    """The program's query heads (zeros past n_heads) into shared memory, for wgmma's A operand."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [CONSUMER_WARPS, 1], [1, 0])
    heads = h0 + gl.arange(0, BLOCK_H, gl.SliceLayout(1, layout))
    head_ok = (heads < n_heads)[:, None]
    cols = gl.arange(0, CHUNK, gl.SliceLayout(0, layout))[None, :]
    q_c_row = q_c_ptr + t * q_c_stride_t + heads.to(gl.int64)[:, None] * q_c_stride_h
    q_r_row = q_r_ptr + t * q_r_stride_t + heads.to(gl.int64)[:, None] * q_r_stride_h
    for c in gl.static_range(D_C // CHUNK):
        qc_smem.slice(c * CHUNK, CHUNK, dim=1).store(gl.load(q_c_row + (c * CHUNK + cols), mask=head_ok, other=0.0))
    for c in gl.static_range(D_R // CHUNK):
        qr_smem.slice(c * CHUNK, CHUNK, dim=1).store(gl.load(q_r_row + (c * CHUNK + cols), mask=head_ok, other=0.0))
    fence_async_shared()
    _partition_barrier()


@gluon.jit
def sparse_mla_fwd_kernel(
    q_c_ptr, q_r_ptr, kv_ptr, kv_bytes_ptr, idx_ptr, o_ptr, lse_ptr,
    q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h, sm_scale_log2, n_idx, n_heads,
    KV_STRIDE: gl.constexpr, ROW_BYTES: gl.constexpr, ROPE_OFFSET: gl.constexpr,
    D_C: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    FP8: gl.constexpr, SPLIT: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr,
):
    head_blocks = gl.cdiv(n_heads, BLOCK_H)
    t = (gl.program_id(0) // head_blocks).to(gl.int64)
    h0 = (gl.program_id(0) % head_blocks) * BLOCK_H
    lo, hi = split_range(n_idx, BLOCK_N)
    # at least one (then empty) tile: a loop that may not run leaves a path on which the P V's
    # accumulator is written while one may be in flight, and ptxas then serialises every wgmma
    n_tiles = gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 1)
    row_start = t * n_idx

    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_C], gl.bfloat16)
    qr_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_R], gl.bfloat16)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_C], gl.bfloat16)
    kr_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_R], gl.bfloat16)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    qc_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_C], q_layout)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_R], qr_layout)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_layout)
    kc_ring = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, D_C], k_layout)
    kr_ring = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, D_R], kr_layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        # bf16: one cp.async arrival per loader thread; fp8: the loader's one arrival after its stores
        mbarrier.init(ready.index(i), count=1 if FP8 else LOADER_WARPS * 32)
        mbarrier.init(free.index(i), count=1)

    gl.warp_specialize([
        (_consumer, (q_c_ptr, q_r_ptr, idx_ptr, o_ptr, lse_ptr, qc_smem, qr_smem, p_smem, kc_ring, kr_ring, ready,
                     free, q_c_stride_t, q_c_stride_h, q_r_stride_t, q_r_stride_h, sm_scale_log2, n_heads,
                     t, h0, row_start, lo, hi, n_tiles, D_C, D_R, BLOCK_N, NUM_STAGES, SPLIT)),
        (_loader, (kv_ptr, kv_bytes_ptr, idx_ptr, kc_ring, kr_ring, ready, free, row_start, lo, hi, n_tiles,
                   KV_STRIDE, ROW_BYTES, ROPE_OFFSET, D_C, D_R, BLOCK_N, NUM_STAGES, FP8, LOADER_WARPS)),
    ], [LOADER_WARPS], [LOADER_REGS])
