"""Decode batches of BATCH_MIN_ROWS-BATCH_MAX_ROWS rows through kernels/gemv.py's dot kernel (every
row in one tile) against torch, and the dispatch that sends only measured shapes there, in the
Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels.gemv as gemv
from kernels.gemv import BATCH_MAX_ROWS, BATCH_MIN_ROWS, GemvConfig, default_config, head_linear, launch, linear

N, K = 37, 100  # a masked strip, masked K steps
TILES = GemvConfig(16, 32, dot=True, block_m=BATCH_MAX_ROWS, num_stages=2)


@pytest.fixture
def measured(monkeypatch) -> GemvConfig:
    """The test's shape (N, K) in the measured table."""
    monkeypatch.setattr(gemv, "BATCH_CONFIGS", {(N, K): TILES})
    return TILES


def close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Within bf16 rounding of the product (fp32 sums rounded once)."""
    assert not torch.isnan(got).any(), "NaN in output (an element was not written?)"
    torch.testing.assert_close(got.double(), ref, rtol=2 ** -8, atol=2 ** -8 * float(ref.abs().max()))


def test_the_tile_holds_the_rows_padded_to_a_power_of_two(measured):
    assert default_config(N, K, BATCH_MIN_ROWS) == GemvConfig(16, 32, dot=True, block_m=64, num_stages=2)
    assert default_config(N, K, BATCH_MAX_ROWS) == GemvConfig(16, 32, dot=True, block_m=128, num_stages=2)
    assert default_config(N, K, BATCH_MIN_ROWS - 1) is None  # cuBLAS below the batch rows
    assert default_config(N, K, BATCH_MAX_ROWS + 1) is None
    assert default_config(N + 1, K, BATCH_MAX_ROWS) is None  # unmeasured shape


def test_the_lm_head_is_the_measured_batch_shape():
    """The sweep's verdict: only the small model's LM head beat cuBLAS at 128 rows."""
    assert default_config(32768, 2048, 128) == GemvConfig(128, 64, 4, dot=True, block_m=128, num_stages=3)
    assert default_config(32768, 2048, 40) == GemvConfig(128, 64, 4, dot=True, block_m=64, num_stages=3)
    for n, k in ((1232, 2048), (5120, 512), (2048, 2048), (11264, 2048), (2048, 5632), (512, 128), (128, 512)):
        assert default_config(n, k, 128) is None, (n, k)


@pytest.mark.parametrize("rows", (BATCH_MIN_ROWS - 1, BATCH_MIN_ROWS, 70, BATCH_MAX_ROWS + 1))
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float32))
def test_linear_at_batch_rows(gen, measured, rows, out_dtype):
    x = torch.randn(rows, K, generator=gen).bfloat16()
    w = torch.randn(N, K, generator=gen).bfloat16()
    got = linear(x, w, backend="triton", out_dtype=out_dtype)
    assert got.dtype == out_dtype
    if BATCH_MIN_ROWS <= rows <= BATCH_MAX_ROWS:
        close(got, torch.einsum("tk,nk->tn", x.double(), w.double()))
        # fp32 logits: the bf16 product widened, as F.linear(x, w).float()
        assert torch.equal(got.float(), linear(x, w, backend="triton").float())
    else:
        assert torch.equal(got, F.linear(x, w).to(out_dtype))


def test_head_linear_at_batch_rows(gen, measured):
    """Per head, a transposed weight view (W_UK's form) and a strided x, as the attention passes them."""
    heads, rows = 3, BATCH_MIN_ROWS + 7
    x = torch.randn(rows, heads, K + 20, generator=gen).bfloat16()[..., :K]
    w = torch.randn(heads, K, N, generator=gen).bfloat16().transpose(1, 2)
    close(head_linear(x, w, backend="triton"), torch.einsum("thk,hnk->thn", x.double(), w.double()))


def test_too_many_rows_for_the_tile_raise(gen):
    x = torch.zeros(BATCH_MAX_ROWS + 1, 1, K, dtype=torch.bfloat16)
    w = torch.zeros(1, N, K, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rows do not fit"):
        launch(x, w, torch.empty(BATCH_MAX_ROWS + 1, 1, N, dtype=torch.bfloat16), TILES)
