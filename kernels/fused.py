"""Fused small ops of the decoder layer in portable Triton, each with its torch reference.

A decode step runs hundreds of small elementwise kernels; inside a CUDA graph each still costs
its own execution (a few microseconds at decode sizes), so what matters is how many there are.
Each op here is one kernel where the torch code is several:
- `add_rms_norm`: the residual add and the next RMSNorm (add, then the norm's square, mean,
  rsqrt and two products), returning the normed rows and the new residual stream;
- `silu_mul`: SwiGLU's silu(gate) * up, over the fused gate/up projection's rows;

backend "torch" runs the reference (CPU, and the torch engine backend); "triton" the kernel,
which on CPU tensors runs in the Triton interpreter. Results are computed in fp32 and rounded
once to the tensors' dtype (the references round after each op), so they match the references
within that dtype's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.triton_utils import new_output, round_to


@triton.jit
def _add_rms_norm_kernel(update_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, n_cols,
                         update_stride, residual_stride, eps, HAS_UPDATE: tl.constexpr, TO_BF16: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(residual_ptr + row * residual_stride + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_UPDATE:
        u = tl.load(update_ptr + row * update_stride + cols, mask=ok, other=0.0).to(tl.float32)
        x = round_to(x + u, TO_BF16)  # the residual stream is held in the model's dtype
        tl.store(new_residual_ptr + row * n_cols + cols, x.to(new_residual_ptr.dtype.element_ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = round_to(x * rstd * w, TO_BF16)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm_reference(update: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if update is not None:
        residual = residual + update
    return F.rms_norm(residual, (residual.shape[-1],), weight, eps), residual


def add_rms_norm(update: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + update) * weight, residual + update) over the last dim of [T, D] rows;
    update None: the norm of residual alone, which comes back as the residual."""
    if resolve_backend(backend, residual.device) == "torch":
        return add_rms_norm_reference(update, residual, weight, eps)
    rows, d = residual.shape
    _check_rows(residual, "residual")
    out = new_output((rows, d), residual.dtype, residual.device)
    new_residual = residual if update is None else new_output((rows, d), residual.dtype, residual.device)
    if update is not None:
        _check_rows(update, "update")
    block = triton.next_power_of_2(d)
    # One program per row: wide rows (v32's 7168) get more warps, as there are few rows at decode.
    _add_rms_norm_kernel[(rows,)](
        residual if update is None else update, residual, weight, out, new_residual, d,
        residual.stride(0) if update is None else update.stride(0), residual.stride(0), eps,
        HAS_UPDATE=update is not None, TO_BF16=residual.dtype == torch.bfloat16, BLOCK=block,
        num_warps=min(16, max(4, block // 512)))
    return out, new_residual


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, n, half, TO_BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    gate = offs + (offs // half) * half  # row r's gate half starts at 2 * half * r, its up half `half` later
    g = tl.load(gate_up_ptr + gate, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gate_up_ptr + gate + half, mask=ok, other=0.0).to(tl.float32)
    y = round_to(g / (1.0 + tl.exp(-g)) * u, TO_BF16)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up where each row of gate_up [..., 2I] is gate [I] then up [I] (the output of
    the fused gate/up projection): [..., I]."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul: the last dim of gate_up {tuple(gate_up.shape)} must be even (gate, then up)")
    half = gate_up.shape[-1] // 2
    if resolve_backend(backend, gate_up.device) == "torch":
        gate, up = gate_up.split(half, dim=-1)
        return F.silu(gate) * up
    if not gate_up.is_contiguous():
        raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} must be contiguous")
    out = new_output((*gate_up.shape[:-1], half), gate_up.dtype, gate_up.device)
    n, block = out.numel(), 1024
    _silu_mul_kernel[(triton.cdiv(n, block),)](gate_up, out, n, half, TO_BF16=gate_up.dtype == torch.bfloat16,
                                                BLOCK=block)
    return out


def _check_rows(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"add_rms_norm: {name} must be [T, D] rows with a contiguous last dim, "
                         f"got shape {tuple(x.shape)} strides {x.stride()}")
