"""fp8 indexer prefill through a tensor descriptor: a tile of query tokens scores each cache block's keys.

The tiled kernel (kernels/indexer_tiled.py) shares each key block among BLOCK_M query tokens (all
heads as one [BLOCK_M * H, d_I] operand), but loads the keys by per-word pointers into registers,
from where the compiler stores them to shared memory for the dot. Here, as in the decode kernel
(kernels/indexer_decode.py), BLOCK_N consecutive keys of one cache block come through the 3-D
tensor descriptor over the cache's values ([num_blocks, block_size, d_I] e4m3) as one box: on
Hopper a bulk asynchronous copy (TMA) straight into shared memory, NUM_STAGES blocks in flight per
program (the loop's software pipelining), and the fp8 dot reads them there. The epilogue is the
tiled kernel's: ReLU, the head weights, the head sum as a reshape and a row sum, the keys' scales.

Tiles straddling requests make one pass per token, as in the tiled kernel (`tile_requests`,
`tile_pass`). Where descriptor loads are no bulk copies (`tensor_memory_copies`), the paged call
keeps the tiled kernel; the interpreter runs this one too (tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.indexer_decode import tensor_memory_copies, values_descriptor
from kernels.indexer_tiled import tile_pass, tile_requests
from kernels.quant_kernels import key_words
from kernels.triton_utils import new_output, row_programs


# block_size unspecialised as in the decode kernel
@triton.jit(do_not_specialize=["block_size"])
def _indexer_prefill_kernel(
    q_ptr, w_ptr, values_desc, key_words_ptr, out_ptr,
    block_table_ptr, seq_ids_ptr, end_ptr,
    n_tokens, n_cols, block_table_stride, block_size,
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_TAIL: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Grid (token tiles, programs per tile): program p scores its tile's key blocks p, p + P, ...
    (BLOCK_N divides block_size, so a key block lies inside one cache block)."""
    rows = tl.arange(0, BLOCK_M * BLOCK_H)  # operand row = token of the tile * BLOCK_H + head
    row_tok = tl.program_id(0) * BLOCK_M + rows // BLOCK_H
    row_head = rows % BLOCK_H
    row_ok = (row_tok < n_tokens) & (row_head < H)
    q = tl.load(q_ptr + row_tok[:, None] * (H * D) + row_head[:, None] * D + tl.arange(0, D)[None, :],
                mask=row_ok[:, None], other=0).to(tl.float8e4nv, bitcast=True)
    w = tl.load(w_ptr + row_tok * H + row_head, mask=row_ok, other=0.0)
    toks, tok_ok, ends, seqs, one_request, passes = tile_requests(seq_ids_ptr, end_ptr, n_tokens, BLOCK_M)
    keys_in_block = tl.arange(0, BLOCK_N)
    for p in range(0, passes):
        mine, seq, w_pass, end_max = tile_pass(p, one_request, tok_ok, seqs, ends, w, BLOCK_M, BLOCK_H)
        limit = n_cols if MASK_TAIL else tl.minimum(end_max, n_cols)
        table_row = block_table_ptr + seq * block_table_stride
        # blocks past the tile's largest context read cache block 0, and their logits are -inf
        for blk in tl.range(tl.program_id(1), tl.cdiv(limit, BLOCK_N), tl.num_programs(1), num_stages=NUM_STAGES):
            col0 = blk * BLOCK_N
            offset = col0 % block_size
            page = tl.load(table_row + col0 // block_size, mask=col0 < end_max, other=0)
            _, first_scale = key_words(page.to(tl.int64), offset, block_size, D // 4)
            scale = tl.load(key_words_ptr + first_scale + keys_in_block).to(tl.float32, bitcast=True)
            keys = tl.reshape(values_desc.load([page, offset, 0]), (BLOCK_N, D))  # e4m3 as stored
            scores = tl.dot(keys, tl.trans(q))  # [BLOCK_N, BLOCK_M * BLOCK_H]
            weighted = tl.maximum(scores, 0.0) * w_pass[None, :]
            logits = tl.sum(tl.reshape(weighted, (BLOCK_N, BLOCK_M, BLOCK_H)), axis=2) * scale[:, None]
            cols = col0 + keys_in_block
            logits = tl.where(cols[:, None] < ends[None, :], logits, float("-inf"))
            tl.store(out_ptr + toks[None, :].to(tl.int64) * n_cols + cols[:, None], logits,
                     mask=mine[None, :] & (cols < n_cols)[:, None])


@dataclass(frozen=True)
class PrefillDescriptorConfig:
    """Query tokens per tile, keys per block (divides the cache block size), warps, programs per
    multiprocessor, and the loop's pipelining depth (key blocks in flight per program)."""

    block_m: int = 4
    block_n: int = 64
    num_warps: int = 4
    programs_per_sm: int = 4
    num_stages: int = 3


def prefill_descriptor_config(key_dtype: str, heads: int, d_i: int, block_size: int,
                              device: torch.device) -> PrefillDescriptorConfig | None:
    """The config for a prefill chunk's fp8 keys where descriptor loads are bulk copies and the
    cache's blocks suit a descriptor (block_size a multiple of 4 and of block_n); else None."""
    cfg = PrefillDescriptorConfig()
    fits = key_dtype == "fp8" and d_i <= 256 and block_size % cfg.block_n == 0
    return cfg if fits and tensor_memory_copies(device) else None


def indexer_prefill_descriptor(q_fp8: torch.Tensor, weights: torch.Tensor, idx_cache: torch.Tensor,
                               block_table: torch.Tensor, seq_ids: torch.Tensor, end: torch.Tensor, block_size: int,
                               n_cols: int, config: PrefillDescriptorConfig, mask_tail: bool = True) -> torch.Tensor:
    """fp32 [T, n_cols] logits of query tokens over their requests' fp8 keys (-inf past end[t]; with
    mask_tail=False those columns are left unwritten, whole key blocks past a tile's largest
    context untouched), on prepared (contiguous, int32) paged inputs; tokens of one request
    contiguous."""
    t, h, d = q_fp8.shape
    if block_size % config.block_n or block_size % 4:
        raise ValueError(f"indexer_prefill_descriptor: block_n={config.block_n} and 4 must divide the cache block "
                         f"size {block_size}")
    out = new_output((t, n_cols), torch.float32, q_fp8.device)
    if t == 0 or n_cols == 0:
        return out
    tiles = triton.cdiv(t, config.block_m)
    grid = (tiles, row_programs(tiles, triton.cdiv(n_cols, config.block_n), q_fp8.device, config.programs_per_sm))
    _indexer_prefill_kernel[grid](
        q_fp8, weights, values_descriptor(idx_cache, d, block_size, config.block_n), idx_cache.view(torch.int32), out,
        block_table, seq_ids, end,
        t, n_cols, block_table.stride(0), block_size,
        H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)), BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        MASK_TAIL=mask_tail, NUM_STAGES=config.num_stages, num_warps=config.num_warps,
    )
    return out
