"""Batch-1 projections whose x-load does the small op before them: one launch where there were two.

In a batch-1 decode step every kernel costs its own microsecond or two, however little it does, so
the small ops between the projections (kernels/fused.py) cost about as much as some projections.
Here the GEMV of kernels/gemv.py computes its input row itself while it streams the weight:
- `add_rms_norm_linear`: RMSNorm(residual + update) * norm_weight, then the projection: a
  sub-layer's pre-norm folded into its first projection (update None: the norm alone, MLA's
  q_norm before the query projection). Every program recomputes the row's norm (one row of the
  hidden size, read from L2), and program 0 writes the new residual stream;
- `silu_mul_linear`: silu(gate) * up over the gate/up projection's row, then the down projection.

The prologue rounds as kernels/fused.py does (the residual sum, then the normed or gated x, to
bf16 in a bf16 model) and sums the norm's squares over the whole row in one block as
`add_rms_norm` does; the multiply-adds then run as gemv's fp32 kernel runs them with the same
config. So a fused result equals the two launches' to the bit where their configs match.

Which products fold is decided per kernel by timing both forms (`prologue_config`): the input,
query and down projections; gate/up's 2,816 programs pay more for redoing the norm than its launch
costs. The gain in the engine is small, bounded by each fold's pass over the row before its
weight streams. Rows beyond gemv.MAX_ROWS, the torch backend, fp16, and the other shapes run the
two ops one after the other.
(The final norm stays apart from the LM head: the runner picks the rows that want logits in
between, and the normed rows are also the speculative draft head's input.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.fused import add_rms_norm, silu_mul
from kernels.gemv import MAX_ROWS, SWEPT_MAX_WEIGHT, GemvConfig, default_config, linear, store_rows
from kernels.triton_utils import new_output, round_to


@triton.jit
def _row_rstd(x_ptr, update_ptr, K, eps, HAS_UPDATE: tl.constexpr, TO_BF16: tl.constexpr,
              ROW_BLOCK: tl.constexpr):
    """1 / RMS of one row of residual (+ update), summed as add_rms_norm's kernel sums it."""
    cols = tl.arange(0, ROW_BLOCK)
    ok = cols < K
    x = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_UPDATE:
        x = round_to(x + tl.load(update_ptr + cols, mask=ok, other=0.0).to(tl.float32), TO_BF16)
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)


@triton.jit
def _normed_x(x_ptr, update_ptr, norm_w_ptr, new_residual_ptr, k, k_ok, rstd, write_end, HAS_UPDATE: tl.constexpr,
              TO_BF16: tl.constexpr):
    """Columns k of the normed row [1, BLOCK_K]; stores the residual sum's columns below write_end."""
    x = tl.load(x_ptr + k[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32)
    if HAS_UPDATE:
        x = round_to(x + tl.load(update_ptr + k[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32), TO_BF16)
        tl.store(new_residual_ptr + k[None, :], x.to(new_residual_ptr.dtype.element_ty), mask=(k < write_end)[None, :])
    w = tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    return round_to(x * rstd * w[None, :], TO_BF16)


@triton.jit
def _silu_mul_x(gate_up_ptr, K, k, k_ok, TO_BF16: tl.constexpr):
    """Columns k of silu(gate) * up [1, BLOCK_K], gate and up the two halves of the row."""
    g = tl.load(gate_up_ptr + k[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32)
    u = tl.load(gate_up_ptr + K + k[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32)
    return round_to(g / (1.0 + tl.exp(-g)) * u, TO_BF16)


@triton.jit
def _gemv_prologue_kernel(x_ptr, update_ptr, norm_w_ptr, w_ptr, out_ptr, new_residual_ptr, N, K, x_row_stride,
                          update_row_stride, w_row_stride, out_row_stride, eps, SILU_MUL: tl.constexpr,
                          HAS_UPDATE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          ROW_BLOCK: tl.constexpr, TO_BF16: tl.constexpr):
    # One row per program column (grid axis 1): at MAX_ROWS = 1 each weight strip is read once.
    row = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, 1)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    x_row = x_ptr + row * x_row_stride
    update_row = update_ptr + row * update_row_stride
    write_end = tl.where(tl.program_id(0) == 0, K, 0)  # program 0 writes the new residual
    if not SILU_MUL:
        rstd = _row_rstd(x_row, update_row, K, eps, HAS_UPDATE, TO_BF16, ROW_BLOCK)
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_row_stride
    acc = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # gemv's multiply-add loop, its x computed here
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if SILU_MUL:
            x = _silu_mul_x(x_row, K, k, k_ok, TO_BF16)
        else:
            x = _normed_x(x_row, update_row, norm_w_ptr, new_residual_ptr + row * K, k, k_ok, rstd, write_end,
                          HAS_UPDATE, TO_BF16)
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    store_rows(out_ptr + row * out_row_stride, acc, rows, cols, rows < 1, col_ok, 0, TO_BF16)


# Every program of a fused GEMV redoes the row's prologue (for a norm: reads the row twice, reduces
# it), so a GEMV of many narrow strips pays it many times over: gate/up's 2,816 programs lost more
# than the norm's launch saves (see `prologue_config`). Only GEMVs of up to this many programs fold.
MAX_FUSED_PROGRAMS = 1024


def prologue_config(n: int, k: int, rows: int) -> GemvConfig | None:
    """The config of a fused [rows, k] x [n, k]^T product, or None where the ops stay two launches.

    gemv's multiply-add config for the shape (the prologue is not in the dot kernel), up to
    MAX_FUSED_PROGRAMS programs; the query projection (K 512, N over 1,024), which gemv leaves to
    cuBLAS, 8 rows x 512 a step (the fastest of 4, 8 and 16 rows). Each fold beat the two launches
    in CUDA graphs at one row (benchmarks/kernels.py --only gemv_fused): the input projection
    1232 x 2048 with the residual add and attn_norm, the query projection 5120 x 512 with q_norm,
    the down projection 2048 x 5632 with silu(gate) * up; gate/up 11264 x 2048 with the residual
    add and mlp_norm lost, so it stays apart (MAX_FUSED_PROGRAMS).
    """
    config = default_config(n, k, rows)
    if config is None and rows <= MAX_ROWS and 128 < k <= 512 and n * k <= SWEPT_MAX_WEIGHT:
        config = GemvConfig(block_n=8, block_k=512)
    if config is None or config.dot or triton.cdiv(n, config.block_n) > MAX_FUSED_PROGRAMS:
        return None
    return config


def _fused_config(x: torch.Tensor, weight: torch.Tensor, k: int, backend: str | None) -> GemvConfig | None:
    """The config when this product runs fused, else None (the two launches' cases)."""
    rows = x.shape[0]
    if rows == 0 or rows > MAX_ROWS or resolve_backend(backend, x.device) == "torch":
        return None
    if x.dtype not in (torch.bfloat16, torch.float32) or weight.dtype != x.dtype:
        return None  # fp16 would need its own rounding of x
    if weight.dim() != 2 or weight.stride(1) != 1 or x.dim() != 2 or x.stride(1) != 1:
        return None
    return prologue_config(weight.shape[0], k, rows)


def launch(config: GemvConfig, x: torch.Tensor, weight: torch.Tensor, k: int, *, update: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, eps: float = 0.0, new_residual: torch.Tensor | None = None,
           silu_mul: bool = False) -> torch.Tensor:
    """The fused product [T, N] over weight [N, k] (unit column stride), one program per BLOCK_N
    columns and row: silu_mul, x the gate/up rows [T, 2k]; else the norm of x [T, k] (+ update, the
    new residual stream then written to new_residual) times norm_weight."""
    rows, n = x.shape[0], weight.shape[0]
    out = new_output((rows, n), x.dtype, x.device)
    _gemv_prologue_kernel[(triton.cdiv(n, config.block_n), rows)](
        x, x if update is None else update, weight if norm_weight is None else norm_weight, weight, out,
        out if new_residual is None else new_residual, n, k, x.stride(0),
        0 if update is None else update.stride(0), weight.stride(0), out.stride(0), eps,
        SILU_MUL=silu_mul, HAS_UPDATE=update is not None, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        ROW_BLOCK=triton.next_power_of_2(k), TO_BF16=x.dtype == torch.bfloat16, num_warps=config.num_warps)
    return out


def add_rms_norm_linear(update: torch.Tensor | None, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(RMSNorm(residual + update) * norm_weight, weight), residual + update) over [T, D] rows
    and weight [N, D]: kernels/fused.add_rms_norm then gemv.linear, one launch up to MAX_ROWS rows.
    update None: the norm of residual alone, which comes back as the residual."""
    d = residual.shape[-1]
    if weight.shape[-1] != d:
        raise ValueError(f"add_rms_norm_linear: residual {tuple(residual.shape)} and weight {tuple(weight.shape)} "
                         f"differ in the hidden size")
    config = _fused_config(residual, weight, d, backend)
    if config is None or update is not None and (update.shape != residual.shape or update.stride(-1) != 1):
        x, new_residual = add_rms_norm(update, residual, norm_weight, eps, backend)
        return linear(x, weight, backend), new_residual
    new_residual = residual if update is None else new_output(tuple(residual.shape), residual.dtype, residual.device)
    out = launch(config, residual, weight, d, update=update, norm_weight=norm_weight, eps=eps,
                  new_residual=new_residual)
    return out, new_residual


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """linear(silu(gate) * up, weight) over gate_up [T, 2I] (gate then up, the fused gate/up
    projection's rows) and weight [N, I]: kernels/fused.silu_mul then gemv.linear, one launch up to
    MAX_ROWS rows."""
    half = gate_up.shape[-1] // 2
    if weight.shape[-1] != half or gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul_linear: gate_up {tuple(gate_up.shape)} must be twice weight "
                         f"{tuple(weight.shape)}'s input width")
    config = _fused_config(gate_up, weight, half, backend)
    if config is None:
        return linear(silu_mul(gate_up, backend), weight, backend)
    return launch(config, gate_up, weight, half, silu_mul=True)
