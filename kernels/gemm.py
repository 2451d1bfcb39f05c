"""Projections at decode batch sizes of MIN_ROWS-MAX_ROWS rows: y = x W^T in portable Triton.

A decode step of 128 requests multiplies 128 rows by each weight: about 128 FLOP per weight byte, so
a projection is bound by streaming its weight only if the tensor cores keep up and enough weight
bytes are in flight. cuBLAS runs these shapes well below that (the small model's projections at
~43 % of copy bandwidth at batch 128 on an H200). Here every program holds all the rows (BLOCK_M,
the rows padded to a power of two) against one strip of BLOCK_N weight rows, so each weight byte is
read from memory once, and streams the strip's K in BLOCK_K steps through `num_stages` loads in
flight into tl.dot. Where the strips alone leave multiprocessors idle the K range is split
(`split_k`): each split stores its fp32 partial sums, and a second kernel adds the splits in a fixed
order, so a result depends on the shape and config, never on timing (no atomics), and a CUDA
graph's replay gives the eager step's numbers.

`silu_mul` computes the down projection's input silu(gate) * up in the x-load from the gate/up
projection's rows (rounded to bf16 as kernels/fused.silu_mul rounds it): the product's own launch
and its round trip through memory saved.

Which shapes take it, and with which tiles, is a table measured in CUDA graphs against cuBLAS
(`default_config`); every other shape, dtype and row count stays on cuBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.triton_utils import dot_dtype, f32_to_bf16, new_output, round_to

MIN_ROWS, MAX_ROWS = 33, 256  # fewer rows: kernels/gemv.py or cuBLAS; more: prefill's GEMMs, cuBLAS's
MIN_BLOCK_M = 16  # tl.dot's smallest tile


@dataclass(frozen=True)
class GemmConfig:
    block_n: int  # weight rows (output columns) per program
    block_k: int  # reduction elements per step
    split_k: int = 1  # programs per strip, each over its own K range (fp32 partials summed after)
    num_warps: int = 4
    num_stages: int = 4  # weight tiles in flight (software pipelining)


@triton.jit
def store_rows(out_ptr, y, rows, cols, row_ok, col_ok, out_row_stride, TO_BF16: tl.constexpr):
    """Store a [rows, cols] tile, rounded to bf16 first when TO_BF16 (also into a wider output)."""
    if TO_BF16:
        y = f32_to_bf16(y)  # round to nearest even on every target (the interpreter's cast truncates)
    tl.store(out_ptr + rows[:, None] * out_row_stride + cols[None, :], y.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def silu_mul_tile(gate_ptrs, K, k, mask, TO_BF16: tl.constexpr):
    """silu(gate) * up at columns k of rows whose gate halves start at gate_ptrs (up K further on)."""
    g = tl.load(gate_ptrs + k[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_ptrs + K + k[None, :], mask=mask, other=0.0).to(tl.float32)
    return round_to(g / (1.0 + tl.exp(-g)) * u, TO_BF16)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, split_len, x_row_stride, w_row_stride, out_row_stride,
                 out_split_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SILU_MUL: tl.constexpr, PARTIAL: tl.constexpr, TO_BF16: tl.constexpr, DOT_DTYPE: tl.constexpr):
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    k_begin = split * split_len
    k_end = tl.minimum(K, k_begin + split_len)
    x_rows = x_ptr + rows[:, None] * x_row_stride
    w_cols = w_ptr + cols[None, :].to(tl.int64) * w_row_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_end
        w_t = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if SILU_MUL:
            x = silu_mul_tile(x_rows, K, k, row_ok[:, None] & k_ok[None, :], TO_BF16)
        else:
            x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x.to(DOT_DTYPE), w_t.to(DOT_DTYPE), acc, input_precision="ieee")  # ieee: fp32 stays fp32
    if PARTIAL:  # this split's sums, unrounded: _split_sum_kernel adds the splits and rounds
        store_rows(out_ptr + split * out_split_stride, acc, rows, cols, row_ok, col_ok, out_row_stride, False)
    else:
        store_rows(out_ptr, acc, rows, cols, row_ok, col_ok, out_row_stride, TO_BF16)


@triton.jit
def _split_sum_kernel(partial_ptr, out_ptr, M, N, splits, out_row_stride, BLOCK: tl.constexpr,
                      TO_BF16: tl.constexpr):
    """out = the splits' partial sums [splits, M, N] added in split order, then rounded."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(splits):
        acc += tl.load(partial_ptr + s * M * N + offs, mask=ok, other=0.0)
    rows, cols = offs // N, offs % N
    if TO_BF16:
        acc = f32_to_bf16(acc)
    tl.store(out_ptr + rows * out_row_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


SPLIT_SUM_BLOCK = 1024


def launch(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, config: GemmConfig,
           silu_mul: bool = False) -> None:
    """out [M, N] = x [M, K] @ weight [N, K]^T (unit column strides; M <= MAX_ROWS); silu_mul: x is
    the gate/up rows [M, 2K] and the product's input silu(gate) * up. A bf16 product rounds to bf16
    also into a wider out (the LM head's fp32 logits: F.linear's bf16 result, then .float())."""
    rows, (n, k) = x.shape[0], weight.shape
    if rows > MAX_ROWS:
        raise ValueError(f"gemm: {rows} rows, at most {MAX_ROWS} fit one program's tile")
    if x.shape[1] != (2 * k if silu_mul else k) or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} (silu_mul {silu_mul}) do not "
                         f"match, or a column stride is not 1")
    block_m = max(MIN_BLOCK_M, triton.next_power_of_2(rows))
    split_len = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    splits = triton.cdiv(k, split_len)
    to_bf16 = x.dtype == torch.bfloat16
    operands = tl.float32 if x.dtype == torch.float32 else dot_dtype(x, tl.bfloat16 if to_bf16 else tl.float16)
    partial = splits > 1
    target = new_output((splits, rows, n), torch.float32, x.device) if partial else out
    _gemm_kernel[(triton.cdiv(n, config.block_n), splits)](
        x, weight, target, rows, n, k, split_len, x.stride(0), weight.stride(0), target.stride(-2),
        target.stride(0) if partial else 0, BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SILU_MUL=silu_mul, PARTIAL=partial, TO_BF16=to_bf16, DOT_DTYPE=operands, num_warps=config.num_warps,
        num_stages=config.num_stages)
    if partial:
        _split_sum_kernel[(triton.cdiv(rows * n, SPLIT_SUM_BLOCK),)](
            target, out, rows, n, splits, out.stride(0), BLOCK=SPLIT_SUM_BLOCK, TO_BF16=to_bf16)


# (N, K) -> config of the small model's projections at batch 128 (see default_config); the down
# projection with silu(gate) * up in its x-load apart.
MEASURED: dict[tuple[int, int], GemmConfig] = {}
MEASURED_SILU_MUL: dict[tuple[int, int], GemmConfig] = {}


def default_config(n: int, k: int, rows: int, silu_mul: bool = False) -> GemmConfig | None:
    """The config of a [rows, k] x [n, k]^T product, or None where cuBLAS keeps it (with silu_mul:
    where silu_mul and the product stay two launches)."""
    if not MIN_ROWS <= rows <= MAX_ROWS:
        return None
    return (MEASURED_SILU_MUL if silu_mul else MEASURED).get((n, k))


def triton_config(x: torch.Tensor, weight: torch.Tensor, backend: str | None,
                  silu_mul: bool = False) -> GemmConfig | None:
    """The config when x [..., K] times weight [N, K]^T runs here: bf16 (the dtype measured), the
    Triton backend, a weight of unit column stride, and a measured shape and row count."""
    if x.dtype != torch.bfloat16 or weight.dtype != x.dtype or weight.dim() != 2 or weight.stride(1) != 1:
        return None
    if resolve_backend(backend, x.device) == "torch":
        return None
    return default_config(weight.shape[0], weight.shape[1], x.numel() // max(1, x.shape[-1]), silu_mul)


def gemm(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig, out_dtype: torch.dtype | None = None,
         silu_mul: bool = False) -> torch.Tensor:
    """`launch` over x [..., K] (or [..., 2K] with silu_mul) into a new [..., N] of out_dtype (x's by default)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = new_output((flat.shape[0], weight.shape[0]), out_dtype or x.dtype, x.device)
    launch(flat, weight, out, config, silu_mul)
    return out.view(*x.shape[:-1], weight.shape[0])
