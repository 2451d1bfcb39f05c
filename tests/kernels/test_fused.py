"""Fused small ops (kernels/fused.py) against their torch references, in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

from kernels.fused import add_rms_norm, add_rms_norm_reference, silu_mul

DTYPES = (torch.float32, torch.bfloat16)


def close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Within the dtype's rounding: the kernels round once, the references after every op."""
    assert not torch.isnan(got).any(), "NaN in output (an element was not written?)"
    tol = 1e-5 if got.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_update", (True, False))
def test_add_rms_norm(gen, dtype, with_update):
    rows, d = 5, 96  # d not a power of two: the row's tail is masked
    residual = torch.randn(rows, d, generator=gen).to(dtype)
    update = torch.randn(rows, 2 * d, generator=gen).to(dtype)[:, :d] if with_update else None  # strided rows
    weight = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    out, new_residual = add_rms_norm(update, residual, weight, 1e-6, backend="triton")
    ref_out, ref_residual = add_rms_norm_reference(update, residual, weight, 1e-6)
    close(out, ref_out)
    close(new_residual, ref_residual)
    assert out.dtype == new_residual.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(gen, dtype):
    gate, up = (torch.randn(3, 1500, generator=gen).to(dtype) for _ in range(2))  # spans two blocks, tail masked
    gate_up = torch.cat((gate, up), dim=-1)
    ref = (torch.nn.functional.silu(gate.float()) * up.float()).to(dtype)
    close(silu_mul(gate_up, backend="triton"), ref)
    close(silu_mul(gate_up, backend="torch"), ref)


def test_bad_shapes_are_refused(gen):
    x = torch.randn(4, 8, generator=gen)
    with pytest.raises(ValueError, match="must be contiguous"):
        silu_mul(x[:, :6], backend="triton")
    with pytest.raises(ValueError, match="must be even"):
        silu_mul(x[:, :5], backend="torch")
    with pytest.raises(ValueError, match="update must be"):
        add_rms_norm(x.t(), x.t().contiguous(), torch.ones(4), 1e-6, backend="triton")
