"""The quantisation kernels (fp8 e4m3 rows, MXFP4 rows) give the torch references' bytes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from kernels.quant import fp8_e4m3_quantize, mxfp4_quantize


def assert_same(x: torch.Tensor) -> None:
    q, scale = fp8_e4m3_quantize(x, backend="triton")
    ref_q, ref_scale = fp8_e4m3_quantize(x, backend="torch")
    assert q.dtype == torch.uint8 and q.shape == x.shape and scale.shape == x.shape[:-1]
    assert torch.equal(scale, ref_scale)
    assert torch.equal(q, ref_q), f"{int((q != ref_q).sum())} bytes differ"


@pytest.mark.parametrize("shape", [(3, 16), (5, 4, 64), (70, 128)])
def test_random_rows_of_every_magnitude(gen, shape):
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-30, 30, shape[:-1] + (1,), generator=gen).float())
    assert_same(x)
    assert_same(x.bfloat16())


def test_heads_sliced_from_wider_rows_are_read_in_place(gen):
    """The indexer's query: [T, heads, D] cut from a fused projection's rows (tokens a wider stride
    apart than heads x D), plus a view that is not of that form (copied first)."""
    wide = torch.randn(5, 3 + 4 * 64 + 7, generator=gen).bfloat16()
    heads = wide[:, 3:3 + 4 * 64].view(5, 4, 64)
    assert heads.stride() == (wide.shape[1], 64, 1)
    assert_same(heads)
    assert_same(torch.randn(4, 6, 32, generator=gen)[:, ::2])


def test_ties_subnormals_zeros_and_the_edges(gen):
    """Rows whose amax is 448 (scale 1), so the chosen values reach the encoder unscaled: halfway
    points between e4m3 neighbours (ties to even), the subnormal range, 448 itself, signed zeros."""
    mant = torch.arange(8).float()
    ties = torch.cat([(1 + (mant + 0.5) / 8) * 2.0**e for e in (-6, -1, 0, 3, 7)])  # between normal codes
    sub = torch.cat([(mant + 0.5) * 2.0**-9, mant * 2.0**-9, torch.tensor([2.0**-10, 2.0**-11, 1e-30])])
    values = torch.cat([ties, -ties, sub, -sub, torch.tensor([448.0, -448.0, 0.0, -0.0, 447.9, 2.0**-6])])
    width = 128
    values = torch.cat([values, torch.zeros(width - values.numel() % width)]).reshape(-1, width)
    values[:, 0] = 448.0
    assert_same(values)
    assert_same(torch.zeros(2, 32))  # all-zero rows: scale 1, bytes 0
    assert_same(torch.rand(4, 64, generator=gen) * 1e-20)


def test_amax_at_powers_of_two_times_448():
    """amax / 448 exactly a power of two keeps that scale; one ulp above doubles it."""
    base = torch.full((4, 16), 0.5)
    base[0, 3] = 448.0 * 4
    base[1, 3] = torch.nextafter(torch.tensor(448.0 * 4), torch.tensor(1e9))
    base[2, 3] = 448.0 / 1024
    base[3, 3] = -448.0 * 2**20
    assert_same(base)


def assert_same_mx(x: torch.Tensor) -> None:
    got = mxfp4_quantize(x, backend="triton")
    ref = mxfp4_quantize(x, backend="torch")
    assert got.shape == ref.shape and got.dtype == torch.uint8
    assert torch.equal(got, ref), f"{int((got != ref).sum())} bytes differ"


@pytest.mark.parametrize("shape", [(3, 32), (5, 2, 64), (40, 128)])
def test_mxfp4_random_rows_of_every_magnitude(gen, shape):
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-40, 40, shape[:-1] + (1,), generator=gen).float())
    assert_same_mx(x)
    assert_same_mx(x.bfloat16())


def test_mxfp4_ties_zeros_and_clamps():
    """Groups with amax 6 (shared exponent 0): every e2m1 value and midpoint (ties go to the even
    code), values past 6 within the group's exponent, signed zeros, an all-zero group."""
    points = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.5])
    group = torch.cat([points, -points])
    group[16] = -0.0
    x = torch.stack([group, torch.zeros(32), group * 2.0**-20, group * 1.01])
    assert_same_mx(x)
