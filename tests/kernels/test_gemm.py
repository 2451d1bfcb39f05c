"""Decode-batch projections (kernels/gemm.py) against torch, in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels.gemm as gemm_module
from kernels.fused import silu_mul
from kernels.gemm import MAX_ROWS, MIN_ROWS, GemmConfig, gemm, launch
from kernels.gemv import linear
from kernels.gemv_fused import silu_mul_linear

# K = 100: masked steps, and splits of unequal length (3 splits of 48, 48, 4 at block_k 16);
# N = 37: a masked strip.
CONFIGS = (GemmConfig(16, 32), GemmConfig(32, 16, split_k=3, num_stages=2), GemmConfig(16, 64, split_k=2))
N, K = 37, 100


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.einsum("tk,nk->tn", x.double(), w.double())


def close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Within bf16 rounding of the fp32 product (the kernel sums in fp32 and rounds once)."""
    assert not torch.isnan(got).any(), "NaN in output (an element or a split was not written?)"
    tol = 2 ** -8
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * float(ref.abs().max()))


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("rows", (MIN_ROWS, 5))  # a 64-row tile with padding rows; a 16-row tile
def test_gemm_matches_the_product(gen, config, rows):
    x = torch.randn(rows, K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    got = gemm(x, w, config)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, N)
    close(got, product(x, w))


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_fp32_output_is_the_bf16_product_widened(gen, config):
    """The LM head's fp32 logits: rounded to bf16 first, as F.linear(x, w).float() rounds."""
    x = torch.randn(MIN_ROWS, K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    got = gemm(x, w, config, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, gemm(x, w, config).float())


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_silu_mul_in_the_x_load_equals_the_two_launches(gen, config):
    gate_up = torch.randn(MIN_ROWS, 2 * K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    got = gemm(gate_up, w, config, silu_mul=True)
    assert torch.equal(got, gemm(silu_mul(gate_up, "triton"), w, config))
    close(got, product(F.silu(gate_up[:, :K].float()) * gate_up[:, K:].float(), w))


def test_split_sums_are_added_in_a_fixed_order(gen):
    """Two launches of one split config give the same bits (no order that depends on timing)."""
    x = torch.randn(MIN_ROWS, K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    config = GemmConfig(16, 16, split_k=4)
    assert torch.equal(gemm(x, w, config), gemm(x, w, config))


def test_too_many_rows_or_mismatched_shapes_raise():
    w = torch.zeros(N, K, dtype=torch.bfloat16)
    out = torch.empty(MAX_ROWS + 1, N, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rows"):
        launch(torch.zeros(MAX_ROWS + 1, K, dtype=torch.bfloat16), w, out, CONFIGS[0])
    with pytest.raises(ValueError, match="silu_mul"):
        launch(torch.zeros(4, K, dtype=torch.bfloat16), w, out, CONFIGS[0], silu_mul=True)


@pytest.fixture
def measured_shape(monkeypatch) -> GemmConfig:
    """The test shape (N, K) in the measured tables, plain and with silu_mul."""
    config = CONFIGS[1]
    monkeypatch.setattr(gemm_module, "MEASURED", {(N, K): config})
    monkeypatch.setattr(gemm_module, "MEASURED_SILU_MUL", {(N, K): config})
    return config


@pytest.mark.parametrize("rows", (MIN_ROWS - 1, MIN_ROWS, MAX_ROWS, MAX_ROWS + 1))
def test_linear_takes_the_gemm_for_measured_shapes_and_row_counts(gen, measured_shape, rows):
    x = torch.randn(rows, K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    got = linear(x, w, backend="triton")
    if MIN_ROWS <= rows <= MAX_ROWS:
        assert torch.equal(got, gemm(x, w, measured_shape))
    else:
        assert torch.equal(got, F.linear(x, w))
    assert torch.equal(linear(x, w, backend="torch"), F.linear(x, w))


def test_silu_mul_linear_folds_for_measured_shapes(gen, measured_shape):
    gate_up = torch.randn(MIN_ROWS, 2 * K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    assert torch.equal(silu_mul_linear(gate_up, w, backend="triton"), gemm(gate_up, w, measured_shape, silu_mul=True))


def test_unmeasured_shapes_and_fp32_stay_on_cublas(gen, measured_shape):
    x = torch.randn(MIN_ROWS, K, generator=gen)
    w = torch.randn(N, K, generator=gen)
    assert gemm_module.triton_config(x, w, "triton") is None  # fp32: not measured
    assert gemm_module.triton_config(x.bfloat16(), w.bfloat16(), "triton") == measured_shape
    assert gemm_module.triton_config(x.bfloat16(), w.bfloat16()[:, :-1], "triton") is None
