"""Projections at decode batch sizes: y = x W^T for a few rows of x, in portable Triton.

At batch 1 a projection reads its whole weight to produce one row: the time is the weight's bytes
over the bandwidth plus the launch. cuBLAS runs these shapes as GEMM tiles, well below the
bandwidth, when one row leaves most of a tile empty. Here each program owns a strip
of BLOCK_N output columns (weight rows) and streams those rows once over the whole K, so the
weight is read once, by many programs at once, and every output element is summed by one program
in a fixed order: no split-K, no atomics, so a result depends only on the shape (and the config
chosen from it), never on timing, and a CUDA graph's replay gives the eager step's numbers.

Two kernels: fp32 multiply-adds of each K step summed into per-column fp32 accumulators
(one row), or tl.dot over a 16-row tile (64 or 128 rows for the decode batches below; padding
rows masked), whose per-row sums do not depend on how many of the tile's rows are real. Which
one, and its tiles, is chosen by rules fitted to a sweep in CUDA graphs over the small model's
shapes (`default_config`; `benchmarks/kernels.py --only gemv`): at one row (batch-1 decode) a
Triton kernel runs only the shapes where it was at least as fast as cuBLAS; the query projection
stays on cuBLAS (with q_norm folded into its x-load, kernels/gemv_fused.py runs it at batch 1).
At four rows cuBLAS is as fast on all but the two per-head products, so more rows than MAX_ROWS
take F.linear (or einsum), as do weights larger or K longer than the sweep's largest (v32's
7,168-wide inputs), other dtypes, `linear`'s weights without a unit column stride, and the torch
backend; the exception is decode batches of BATCH_MIN_ROWS-BATCH_MAX_ROWS rows on the shapes where
the dot kernel with every row in one tile is the faster (`BATCH_CONFIGS`: the LM head, whose fp32
logits it stores itself). Smaller shapes outside the sweep (the tiny model's, tensor-parallel
slices, v32's per-head W_UK / W_UV with 128 heads) follow the same rules untimed.

`linear` is nn.Linear's product (with `out_dtype=torch.float32` a bf16 GEMV stores the LM head's
fp32 logits itself, rounded to bf16 first as F.linear(x, w).float() rounds: the cast's launch
saved); `head_linear` the per-head form y[t, h] = x[t, h] W[h]^T of absorbed MLA's W_UK and W_UV
products (einsum "thk,hnk->thn", any weight strides).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.triton_utils import dot_dtype, f32_to_bf16, new_output

# Rows up to this many take a Triton kernel (batch-1 decode); more rows are cuBLAS's (see the module
# docstring). A capture size of the decode graphs, so a graph and the eager step take the same kernel.
MAX_ROWS = 1
DOT_ROWS = 16  # the dot kernel's row tile: tl.dot needs 16
# Decode batches of BATCH_MIN_ROWS-BATCH_MAX_ROWS rows: the dot kernel with every row in one tile (the
# rows padded to a power of two), for the shapes in BATCH_CONFIGS; other shapes and row counts stay on
# cuBLAS. With the default capture sizes (multiples of 8, none past a power of two that the rows it
# pads are not) a graph's batch and the eager step's rows take the same tile.
BATCH_MIN_ROWS, BATCH_MAX_ROWS = 33, 128


@dataclass(frozen=True)
class GemvConfig:
    block_n: int  # output columns (weight rows) per program
    block_k: int  # reduction elements per step
    num_warps: int = 4
    dot: bool = False  # tl.dot over DOT_ROWS-row tiles, else fp32 multiply-adds over block_m rows
    block_m: int = 1  # rows per program (DOT_ROWS for the dot kernel); the product's rows must fit
    num_stages: int = 3  # dot kernel: weight tiles in flight (software pipelining)


@triton.jit
def store_rows(out_ptr, y, rows, cols, row_ok, col_ok, out_row_stride, TO_BF16: tl.constexpr):
    if TO_BF16:
        y = f32_to_bf16(y)  # round to nearest even on every target (the interpreter's cast truncates)
    tl.store(out_ptr + rows[:, None] * out_row_stride + cols[None, :], y.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gemv_fma_kernel(x_ptr, w_ptr, out_ptr, M, N, K, x_row_stride, x_head_stride, w_head_stride, w_row_stride,
                     w_col_stride, out_row_stride, out_head_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, TO_BF16: tl.constexpr):
    head = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    col_ok, row_ok = cols < N, rows < M
    x_rows = x_ptr + head * x_head_stride + rows[:, None] * x_row_stride
    w_rows = w_ptr + head * w_head_stride + cols[:, None].to(tl.int64) * w_row_stride
    # Wide steps (BLOCK_N x BLOCK_K weights, 16-32 KB) keep enough loads in flight per program:
    # the compiler does not pipeline loads that feed no dot.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :] * w_col_stride, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    store_rows(out_ptr + head * out_head_stride, acc, rows, cols, row_ok, col_ok, out_row_stride, TO_BF16)


@triton.jit
def _gemv_dot_kernel(x_ptr, w_ptr, out_ptr, M, N, K, x_row_stride, x_head_stride, w_head_stride, w_row_stride,
                     w_col_stride, out_row_stride, out_head_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, TO_BF16: tl.constexpr, DOT_DTYPE: tl.constexpr):
    head = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    col_ok, row_ok = cols < N, rows < M
    x_rows = x_ptr + head * x_head_stride + rows[:, None] * x_row_stride
    w_cols = w_ptr + head * w_head_stride + cols[None, :].to(tl.int64) * w_row_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w_t = tl.load(w_cols + k[:, None] * w_col_stride, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x.to(DOT_DTYPE), w_t.to(DOT_DTYPE), acc, input_precision="ieee")  # ieee: fp32 models stay fp32
    store_rows(out_ptr + head * out_head_stride, acc, rows, cols, row_ok, col_ok, out_row_stride, TO_BF16)


# The largest weight, and the longest K, of the shapes the sweep covered (the small model's LM head,
# its down projection); cuBLAS keeps anything larger (v32's 7,168-wide inputs were not swept).
SWEPT_MAX_WEIGHT = 32768 * 2048
SWEPT_MAX_K = 5632


# (N, K) -> the dot kernel's tiles (block_m set by the rows) where they beat cuBLAS at batch
# decode (a sweep in CUDA graphs: benchmarks/kernels.py --only gemv_batch). Only the LM head with
# fp32 logits: F.linear then .float() makes a second pass over the logits, which this kernel's own
# fp32 store saves. Past 128 rows its fp32 accumulator tile overflows the registers, hence
# BATCH_MAX_ROWS. cuBLAS keeps every other projection: each strip streams its K alone, so their
# narrow outputs leave most multiprocessors idle, and splitting K (a second launch summing the
# parts) did not close the gap.
BATCH_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (32768, 2048): GemvConfig(block_n=128, block_k=64, num_warps=4, dot=True, block_m=BATCH_MAX_ROWS, num_stages=3),
}


def default_config(n: int, k: int, rows: int) -> GemvConfig | None:
    """The launch config for an [rows, k] x [n, k]^T product, or None where cuBLAS is as fast.

    Rules fitted to a sweep in CUDA graphs at one row over the small model's projections
    (benchmarks/kernels.py --only gemv), each the config that beat cuBLAS on its shapes:
    - K >= 2048 (input projection 1232 x 2048, wo 2048 x 2048, down 2048 x 5632, LM head
      32768 x 2048): multiply-adds over 4 weight rows x 2048 a step (gate/up 11264 x 2048, a tie
      with cuBLAS, kept for one rule);
    - K <= 128 (W_UK per head, 512 x 128): dot over 64 x 128 tiles;
    - N <= 1024 (W_UV per head, 128 x 512): multiply-adds over 8 x 1024;
    - the query projection 5120 x 512 matches none: no config beat cuBLAS on it; with q_norm
      folded in, one does (kernels/gemv_fused.prologue_config).
    """
    if BATCH_MIN_ROWS <= rows <= BATCH_MAX_ROWS and (n, k) in BATCH_CONFIGS:
        return replace(BATCH_CONFIGS[n, k], block_m=triton.next_power_of_2(rows))
    if rows > MAX_ROWS or k > SWEPT_MAX_K or n * k > SWEPT_MAX_WEIGHT:
        return None
    if k >= 2048:
        return GemvConfig(block_n=4, block_k=2048)
    if k <= 128:
        return GemvConfig(block_n=64, block_k=128, dot=True, block_m=DOT_ROWS, num_stages=4)
    if n <= 1024:
        return GemvConfig(block_n=8, block_k=1024)
    return None


def launch(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, config: GemvConfig) -> None:
    """out[t, h] = x[t, h] @ weight[h]^T over x [T, H, K] (unit column stride), weight [H, N, K] (any
    strides), out [T, H, N] contiguous; T <= config.block_m. The product rounds to x's dtype where
    that is bf16 and out is wider (the LM head's fp32 logits: F.linear's bf16 result, then .float())."""
    rows, heads, k = x.shape
    n = weight.shape[1]
    if rows > config.block_m:
        raise ValueError(f"gemv: {rows} rows do not fit the config's {config.block_m}")
    grid = (triton.cdiv(n, config.block_n), heads)
    args = (x, weight, out, rows, n, k, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), weight.stride(2),
            out.stride(0), out.stride(1))
    to_bf16 = x.dtype == torch.bfloat16
    if not config.dot:
        _gemv_fma_kernel[grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                               TO_BF16=to_bf16, num_warps=config.num_warps)
        return
    operands = tl.float32 if x.dtype == torch.float32 else dot_dtype(x, tl.bfloat16 if x.dtype == torch.bfloat16
                                                                      else tl.float16)
    _gemv_dot_kernel[grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                           TO_BF16=to_bf16, DOT_DTYPE=operands, num_warps=config.num_warps,
                           num_stages=config.num_stages)


def _triton_config(x: torch.Tensor, weight: torch.Tensor, rows: int, backend: str | None) -> GemvConfig | None:
    """The config when this product runs in Triton, else None (torch backend, too many rows, dtypes,
    shapes where cuBLAS was as fast)."""
    if rows == 0 or (rows > MAX_ROWS and not BATCH_MIN_ROWS <= rows <= BATCH_MAX_ROWS):
        return None  # first: every prefill and most batches end here, before any other check
    if resolve_backend(backend, x.device) == "torch":
        return None
    if x.dtype != weight.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    return default_config(weight.shape[-2], weight.shape[-1], rows)


def linear(x: torch.Tensor, weight: torch.Tensor, backend: str | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """F.linear(x, weight).to(out_dtype) without bias: x [..., K], weight [N, K] -> [..., N]; a Triton
    GEMV on the Triton backend where `default_config` has one (up to MAX_ROWS rows of x, and the
    BATCH_CONFIGS shapes at BATCH_MIN_ROWS-BATCH_MAX_ROWS rows), F.linear otherwise. A bf16 product
    wanted in fp32 (the LM head's logits) is stored so by the GEMV itself: one kernel less."""
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} differ in K")
    out_dtype = out_dtype or x.dtype
    rows = x.numel() // max(1, x.shape[-1])
    config = _triton_config(x, weight, rows, backend)
    widened = out_dtype == torch.float32 and x.dtype == torch.bfloat16
    if config is None or weight.stride(-1) != 1 or not (out_dtype == x.dtype or widened):
        y = F.linear(x, weight)
        return y if y.dtype == out_dtype else y.to(out_dtype)  # no op dispatched for nothing
    flat = x.reshape(rows, 1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = new_output((rows, 1, weight.shape[0]), out_dtype, x.device)
    launch(flat, weight.unsqueeze(0), out, config)
    return out.view(*x.shape[:-1], weight.shape[0])


def head_linear(x: torch.Tensor, weight: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Per head y[t, h] = x[t, h] @ weight[h]^T: x [T, H, K], weight [H, N, K] (any strides: a
    transposed view serves the products that reduce over the weight's rows) -> [T, H, N]."""
    if x.dim() != 3 or weight.dim() != 3 or x.shape[1:] != (weight.shape[0], weight.shape[2]):
        raise ValueError(f"head_linear: x {tuple(x.shape)} must be [T, H, K] and weight "
                         f"{tuple(weight.shape)} [H, N, K]")
    config = _triton_config(x, weight, x.shape[0], backend)
    if config is None:
        # bmm over head-major views, written into a token-major output: einsum returns a head-major
        # result whose token-major use (the sparse MLA's query, W_UV's rows into wo) copies it.
        out = torch.empty(x.shape[0], x.shape[1], weight.shape[1], dtype=torch.result_type(x, weight), device=x.device)
        torch.bmm(x.transpose(0, 1), weight.transpose(1, 2), out=out.transpose(0, 1))
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = new_output((x.shape[0], x.shape[1], weight.shape[1]), x.dtype, x.device)
    launch(x, weight, out, config)
    return out
