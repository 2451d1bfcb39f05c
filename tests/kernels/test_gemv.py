"""Decode-size projections (kernels/gemv.py) against F.linear and einsum, in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.gemv import DOT_ROWS, MAX_ROWS, GemvConfig, default_config, head_linear, launch, linear

DTYPES = (torch.float32, torch.bfloat16)
# Small tiles so that K = 100 takes several steps and a masked tail, N = 37 a masked strip.
CONFIGS = (GemvConfig(4, 32), GemvConfig(8, 64, block_m=2), GemvConfig(16, 32, dot=True, block_m=DOT_ROWS),
           GemvConfig(32, 16, dot=True, block_m=DOT_ROWS, num_stages=2))


def close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, equation: str) -> None:
    """Within the dtype's rounding of the fp32 product (the kernels sum in fp32 and round once)."""
    assert not torch.isnan(got).any(), "NaN in output (an element was not written?)"
    ref = torch.einsum(equation, x.double(), w.double())
    tol = 1e-5 if got.dtype == torch.float32 else 2 ** -8
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * float(ref.abs().max()))
    assert got.dtype == x.dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", (1, MAX_ROWS + 1, 5))
@pytest.mark.parametrize("k", (300, 2100))  # the two multiply-add configs (N <= 1024; K >= 2048)
def test_linear_matches_f_linear(gen, dtype, rows, k):
    x = torch.randn(rows, k, generator=gen).to(dtype)  # odd N and K: masked strips and steps
    w = torch.randn(37, k, generator=gen).to(dtype)
    got = linear(x, w, backend="triton")
    close(got, x, w, "tk,nk->tn")
    if rows > MAX_ROWS:  # past the bound: F.linear itself
        assert torch.equal(got, F.linear(x, w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", (1, MAX_ROWS + 1))
def test_fp32_output_equals_the_product_then_float(gen, dtype, rows):
    """The LM head's fp32 logits: a bf16 product rounded to bf16 first, as F.linear(x, w).float()."""
    x = torch.randn(rows, 2100, generator=gen).to(dtype)
    w = torch.randn(37, 2100, generator=gen).to(dtype)
    got = linear(x, w, backend="triton", out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, linear(x, w, backend="triton").float())


def test_default_configs_follow_the_sweep():
    """Batch-1 shapes of the small model take the configs that beat cuBLAS in CUDA graphs; the query
    projection, more rows and shapes larger than the sweep's stay on cuBLAS (None)."""
    fma_wide = GemvConfig(block_n=4, block_k=2048)
    for n, k in ((1232, 2048), (2048, 2048), (2048, 5632), (11264, 2048), (32768, 2048)):
        assert default_config(n, k, 1) == fma_wide, (n, k)
    assert default_config(512, 128, 1) == GemvConfig(64, 128, dot=True, block_m=DOT_ROWS, num_stages=4)  # W_UK
    assert default_config(128, 512, 1) == GemvConfig(8, 1024)  # W_UV
    assert default_config(5120, 512, 1) is None  # the query projection
    assert default_config(1232, 2048, MAX_ROWS + 1) is None
    assert default_config(2 * 18432, 7168, 1) is None  # v32's gate/up: never swept


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{'dot' if c.dot else 'fma'}-m{c.block_m}-n{c.block_n}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_launch_configs(gen, config, dtype):
    for rows in sorted({1, config.block_m // 2 + 1, config.block_m}):
        x = torch.randn(rows, 3, 100, generator=gen).to(dtype)
        w = torch.randn(3, 37, 100, generator=gen).to(dtype)
        out = torch.full((rows, 3, 37), float("nan"), dtype=dtype)
        launch(x, w, out, config)
        close(out, x, w, "thk,hnk->thn")


@pytest.mark.parametrize("config", CONFIGS[1:3], ids=("fma", "dot"))
def test_rows_sum_alike_whatever_the_row_count(gen, config):
    """A row's result does not depend on how many rows share the launch (the dot kernel's 16-row
    tile, the multiply-add kernel's rows): the same product gives the same numbers at any row count
    a config takes."""
    x = torch.randn(config.block_m, 1, 100, generator=gen).bfloat16()
    w = torch.randn(1, 37, 100, generator=gen).bfloat16()
    full = torch.empty(config.block_m, 1, 37, dtype=torch.bfloat16)
    launch(x, w, full, config)
    one = torch.empty(1, 1, 37, dtype=torch.bfloat16)
    launch(x[:1], w, one, config)
    assert torch.equal(one[0], full[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_keeps_leading_dims_and_reads_strided_rows(gen, dtype):
    x = torch.randn(2, 3, 2 * 96, generator=gen).to(dtype)[..., :96]  # rows of a wider tensor
    w = torch.randn(40, 96, generator=gen).to(dtype)
    got = linear(x, w, backend="triton")
    assert got.shape == (2, 3, 40)
    close(got, x, w, "abk,nk->abn")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", (1, 3, MAX_ROWS + 1))
def test_head_linear(gen, dtype, rows):
    """Both MLA products: W_UV as stored [H, N, K], W_UK through its transposed view (reduces over its rows)."""
    x = torch.randn(rows, 4, 48, generator=gen).to(dtype)
    w_uv = torch.randn(4, 20, 48, generator=gen).to(dtype)
    close(head_linear(x, w_uv, backend="triton"), x, w_uv, "thk,hnk->thn")
    w_uk = torch.randn(4, 48, 20, generator=gen).to(dtype)  # [H, K, N] as stored
    close(head_linear(x, w_uk.transpose(1, 2), backend="triton"), x, w_uk, "thk,hkn->thn")


def test_torch_backend_is_the_reference(gen):
    x, w = torch.randn(1, 64, generator=gen), torch.randn(24, 64, generator=gen)
    assert torch.equal(linear(x, w, backend="torch"), F.linear(x, w))
    xh, wh = torch.randn(1, 2, 64, generator=gen), torch.randn(2, 24, 64, generator=gen)
    assert torch.equal(head_linear(xh, wh, backend="torch"), torch.einsum("thk,hnk->thn", xh, wh))


def test_bad_shapes_are_refused(gen):
    x, w = torch.randn(2, 64, generator=gen), torch.randn(24, 32, generator=gen)
    with pytest.raises(ValueError, match="differ in K"):
        linear(x, w, backend="triton")
    with pytest.raises(ValueError, match=r"\[T, H, K\]"):
        head_linear(x, w, backend="triton")
    with pytest.raises(ValueError, match="do not fit"):
        launch(torch.randn(MAX_ROWS + 1, 1, 32), w.unsqueeze(0), torch.empty(MAX_ROWS + 1, 1, 24),
               GemvConfig(8, 32, block_m=MAX_ROWS))
