"""fp8 indexer decode through a tensor descriptor: each block of keys' values as one bulk copy.

In the indexer key cache (kernels/quant.py) a cache block's keys' values are one contiguous
[block_size, d_I] array of e4m3 bytes, followed by the keys' scale words. A decode step (one query
token per request) scores BLOCK_N consecutive keys of one cache block at a time: their values come
through a 3-D tensor descriptor over the cache, [num_blocks, block_size, d_I] with the blocks'
stride, as one [1, BLOCK_N, d_I] box; on Hopper that is a bulk asynchronous copy (TMA) into shared
memory, with NUM_STAGES blocks in flight per program (the loop's software pipelining), no per-word
address or register, and the dot reads the e4m3 operand where the copy left it. The keys' scale
words come by plain vector loads. Where a target has no such copy (NVIDIA before sm_90, AMD without
TDM) Triton rewrites descriptor loads to pointer loads; the interpreter runs them as well.

The bulk copies free the registers that per-word loads hold, so more key blocks stay in flight
per program and the loop waits on memory less (`benchmarks/indexer_decode.py` times the default
paths, `--sweep` beside one-token tiles). MXFP4 keys keep the group dots of
kernels/indexer_tiled.py: that loop is bound by ALU work per block, which faster loads leave as is.

The descriptor holds the cache's address: it is made once per cache tensor and kept while that
tensor lives (`values_descriptor`), so a CUDA graph captures the same one that eager launches use.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.indexer_tiled import fp8_dot_supported
from kernels.quant_kernels import key_words
from kernels.triton_utils import new_output, row_programs


# block_size unspecialised as in kernels/indexer.py's kernel (why: there); the config was tuned so.
@triton.jit(do_not_specialize=["block_size"])
def _indexer_decode_kernel(
    q_ptr, w_ptr, values_desc, key_words_ptr, out_ptr,
    block_table_ptr, seq_ids_ptr, end_ptr,
    n_cols, block_table_stride, block_size,
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_TAIL: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Grid (tokens, programs per token): program p scores its token's key blocks p, p + P, ...
    (BLOCK_N divides block_size, so a key block lies inside one cache block)."""
    tok = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    q = tl.load(q_ptr + tok * (H * D) + heads[:, None] * D + tl.arange(0, D)[None, :], mask=head_ok[:, None], other=0)
    q = q.to(tl.float8e4nv, bitcast=True)
    w = tl.load(w_ptr + tok * H + heads, mask=head_ok, other=0.0)
    end = tl.load(end_ptr + tok)
    limit = n_cols if MASK_TAIL else tl.minimum(end, n_cols)
    table_row = block_table_ptr + tl.load(seq_ids_ptr + tok).to(tl.int64) * block_table_stride
    keys_in_block = tl.arange(0, BLOCK_N)
    # blocks past the end read cache block 0, and their logits are -inf
    for blk in tl.range(tl.program_id(1), tl.cdiv(limit, BLOCK_N), tl.num_programs(1), num_stages=NUM_STAGES):
        col0 = blk * BLOCK_N
        offset = col0 % block_size
        page = tl.load(table_row + col0 // block_size, mask=col0 < end, other=0)
        _, first_scale = key_words(page.to(tl.int64), offset, block_size, D // 4)
        scale_bits = tl.load(key_words_ptr + first_scale + keys_in_block)
        keys = tl.reshape(values_desc.load([page, offset, 0]), (BLOCK_N, D))  # e4m3 as stored
        scores = tl.dot(keys, tl.trans(q))  # [BLOCK_N, BLOCK_H]
        logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :], axis=1) * scale_bits.to(tl.float32, bitcast=True)
        cols = col0 + keys_in_block
        logits = tl.where(cols < end, logits, float("-inf"))
        tl.store(out_ptr + tok.to(tl.int64) * n_cols + cols, logits, mask=cols < n_cols)


# The fewest query heads that take this path: it pays at 16 heads (the small model's indexer, in
# its batch-128 decode graph) as at 64; fewer heads are untimed and keep the tiled kernel.
DESCRIPTOR_MIN_HEADS = 16


@dataclass(frozen=True)
class DescriptorDecodeConfig:
    """Keys per block (divides the cache block size), warps, programs per multiprocessor, and key
    blocks in flight per program (the loop's pipelining depth; the block table's load takes one
    stage, so num_stages 5 holds 3 blocks' values in shared memory)."""

    block_n: int = 64
    num_warps: int = 4
    programs_per_sm: int = 16
    num_stages: int = 5


def descriptor_decode_config(key_dtype: str, heads: int, d_i: int, block_size: int,
                             device: torch.device) -> DescriptorDecodeConfig | None:
    """The config for a decode step's fp8 keys where this path was tuned (64 and 16 heads, tensor
    memory copies from sm_90) and the cache's blocks suit a descriptor (block strides
    of 16-byte multiples: block_size a multiple of 4 and of block_n); else None."""
    cfg = DescriptorDecodeConfig()
    fits = key_dtype == "fp8" and heads >= DESCRIPTOR_MIN_HEADS and d_i <= 256 and block_size % cfg.block_n == 0
    return cfg if fits and tensor_memory_copies(device) else None


@functools.cache  # asked at every decode step; the capability query is a driver call
def tensor_memory_copies(device: torch.device) -> bool:
    """Whether descriptor loads are bulk copies on this device: NVIDIA from compute capability 9.0
    (Hopper), with fp8 dots."""
    return fp8_dot_supported(device) and torch.cuda.get_device_capability(device) >= (9, 0)


# id of a cache tensor, its address, block size, keys per block -> the descriptor; an entry goes
# when its tensor does (weakref.finalize), so a descriptor never outlives the memory it names
_DESCRIPTORS: dict[tuple[int, int, int, int], TensorDescriptor] = {}


def values_descriptor(idx_cache: torch.Tensor, d_i: int, block_size: int, block_n: int) -> TensorDescriptor:
    """The descriptor of an fp8 key cache's values, [num_blocks, block_size, d_I] e4m3 with box
    [1, block_n, d_I], made on first use and kept while idx_cache lives."""
    key = (id(idx_cache), idx_cache.data_ptr(), block_size, block_n)
    desc = _DESCRIPTORS.get(key)
    if desc is None:
        values = idx_cache.view(torch.float8_e4m3fn)
        desc = TensorDescriptor(values, [idx_cache.shape[0], block_size, d_i], [idx_cache.shape[1], d_i, 1],
                                [1, block_n, d_i])
        _DESCRIPTORS[key] = desc
        weakref.finalize(idx_cache, _DESCRIPTORS.pop, key, None)
    return desc


def indexer_decode_descriptor(q_fp8: torch.Tensor, weights: torch.Tensor, idx_cache: torch.Tensor,
                              block_table: torch.Tensor, seq_ids: torch.Tensor, end: torch.Tensor, block_size: int,
                              n_cols: int, config: DescriptorDecodeConfig, mask_tail: bool = True) -> torch.Tensor:
    """fp32 [T, n_cols] logits of one query token per row over its request's fp8 keys (-inf past
    end[t]; with mask_tail=False those columns are left unwritten), on prepared (contiguous,
    int32) paged inputs and a GPU with fp8 dots (or the interpreter)."""
    t, h, d = q_fp8.shape
    if block_size % config.block_n or block_size % 4:
        raise ValueError(f"indexer_decode_descriptor: block_n={config.block_n} and 4 must divide the cache block "
                         f"size {block_size}")
    out = new_output((t, n_cols), torch.float32, q_fp8.device)
    if t == 0 or n_cols == 0:
        return out
    grid = (t, row_programs(t, triton.cdiv(n_cols, config.block_n), q_fp8.device, config.programs_per_sm))
    _indexer_decode_kernel[grid](
        q_fp8, weights, values_descriptor(idx_cache, d, block_size, config.block_n), idx_cache.view(torch.int32), out,
        block_table, seq_ids, end,
        n_cols, block_table.stride(0), block_size,
        H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)), BLOCK_N=config.block_n, MASK_TAIL=mask_tail,
        NUM_STAGES=config.num_stages, num_warps=config.num_warps,
    )
    return out
