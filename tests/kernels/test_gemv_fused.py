"""Projections with the small op in their x-load (kernels/gemv_fused.py) against the two launches
they replace and against torch, in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels.gemv as gemv
import kernels.gemv_fused as gemv_fused
from kernels.fused import add_rms_norm, add_rms_norm_reference, silu_mul
from kernels.gemv import MAX_ROWS, GemvConfig, linear
from kernels.gemv_fused import add_rms_norm_linear, silu_mul_linear

DTYPES = (torch.float32, torch.bfloat16)
# K = 100: a masked tail in the norm's row block and in the GEMV's steps, N = 37 a masked strip.
CONFIGS = (GemvConfig(4, 32), GemvConfig(16, 128))


@pytest.fixture(params=CONFIGS, ids=lambda c: f"n{c.block_n}-k{c.block_k}")
def config(request, monkeypatch) -> GemvConfig:
    """Every shape takes this config, fused and unfused alike."""
    monkeypatch.setattr(gemv, "default_config", lambda n, k, rows: request.param if rows <= MAX_ROWS else None)
    monkeypatch.setattr(gemv_fused, "default_config", gemv.default_config)
    return request.param


def norm_inputs(gen: torch.Generator, dtype: torch.dtype, rows: int, with_update: bool):
    residual = torch.randn(rows, 100, generator=gen).to(dtype)
    update = torch.randn(rows, 2 * 100, generator=gen).to(dtype)[:, :100] if with_update else None  # strided rows
    norm_weight = (1 + 0.1 * torch.randn(100, generator=gen)).to(dtype)
    weight = torch.randn(37, 100, generator=gen).to(dtype)
    return update, residual, norm_weight, weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_update", (True, False))
def test_add_rms_norm_linear_equals_the_two_launches(gen, config, dtype, with_update):
    update, residual, norm_weight, weight = norm_inputs(gen, dtype, 1, with_update)
    out, new_residual = add_rms_norm_linear(update, residual, norm_weight, 1e-6, weight, backend="triton")
    x, ref_residual = add_rms_norm(update, residual, norm_weight, 1e-6, backend="triton")
    assert torch.equal(out, linear(x, weight, backend="triton"))
    assert torch.equal(new_residual, ref_residual)
    # and the torch reference, within the dtype's rounding
    x_ref, _ = add_rms_norm_reference(update, residual, norm_weight, 1e-6)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), F.linear(x_ref.float(), weight.float()), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_linear_equals_the_two_launches(gen, config, dtype):
    gate_up = torch.randn(1, 200, generator=gen).to(dtype)
    weight = torch.randn(37, 100, generator=gen).to(dtype)
    out = silu_mul_linear(gate_up, weight, backend="triton")
    assert torch.equal(out, linear(silu_mul(gate_up, backend="triton"), weight, backend="triton"))
    gate, up = gate_up.float().split(100, dim=-1)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), F.linear(F.silu(gate) * up, weight.float()), rtol=tol, atol=tol)


def test_more_rows_and_the_torch_backend_take_the_two_ops(gen, config):
    update, residual, norm_weight, weight = norm_inputs(gen, torch.bfloat16, MAX_ROWS + 2, True)
    out, new_residual = add_rms_norm_linear(update, residual, norm_weight, 1e-6, weight, backend="triton")
    x, ref_residual = add_rms_norm(update, residual, norm_weight, 1e-6, backend="triton")
    assert torch.equal(out, F.linear(x, weight)) and torch.equal(new_residual, ref_residual)
    out, new_residual = add_rms_norm_linear(update, residual, norm_weight, 1e-6, weight, backend="torch")
    x, ref_residual = add_rms_norm_reference(update, residual, norm_weight, 1e-6)
    assert torch.equal(out, F.linear(x, weight)) and torch.equal(new_residual, ref_residual)


def test_prologue_configs_follow_the_sweep():
    """The small model's folds at one row: the input projection's pre-norm and the down
    projection's silu(gate) * up take gemv's config, the query projection's q_norm its own; gate/up
    (2,816 programs of gemv's config) and dot configs stay two launches."""
    for n, k in ((1232, 2048), (2048, 5632)):
        assert gemv_fused.prologue_config(n, k, 1) == gemv.default_config(n, k, 1) == GemvConfig(4, 2048)
    assert gemv_fused.prologue_config(5120, 512, 1) == GemvConfig(8, 512)  # the query projection, with q_norm
    assert gemv_fused.prologue_config(11264, 2048, 1) is None  # gate/up: too many programs
    assert gemv_fused.prologue_config(512, 128, 1) is None  # W_UK's dot config
    assert gemv_fused.prologue_config(32768, 1536, 1) is None  # v32's query projection: never swept
    assert gemv_fused.prologue_config(1232, 2048, MAX_ROWS + 1) is None


def test_bad_shapes_are_refused(gen):
    x, w = torch.randn(1, 64, generator=gen), torch.randn(24, 32, generator=gen)
    with pytest.raises(ValueError, match="differ in the hidden size"):
        add_rms_norm_linear(None, x, torch.ones(64), 1e-6, w, backend="triton")
    with pytest.raises(ValueError, match="twice"):
        silu_mul_linear(x, torch.randn(24, 40, generator=gen), backend="triton")


@pytest.mark.slow  # ~30 s in the interpreter
def test_model_decode_step_fused_equals_unfused(monkeypatch):
    """The tiny model's batch-1 decode steps in bf16 on the Triton backend, with every projection on the
    GEMV (one config for all shapes): folding the norms and silu(gate) * up into the projections
    changes no logit, and the layer's four folds ran fused (the pre-norms, with and without a
    residual update, q_norm, and silu(gate) * up)."""
    from server.engine.model_runner import ModelRunner
    from tests.server.engine_fixtures import prompt, tiny_config
    from tests.server.test_model import feed

    every_shape = GemvConfig(16, 256)
    monkeypatch.setattr(gemv, "default_config", lambda n, k, rows: every_shape if rows <= MAX_ROWS else None)
    monkeypatch.setattr(gemv_fused, "default_config", gemv.default_config)
    launches = []
    real_launch = gemv_fused.launch
    monkeypatch.setattr(gemv_fused, "launch", lambda *a, **kw: launches.append(1) or real_launch(*a, **kw))

    def logits() -> torch.Tensor:
        runner = ModelRunner(tiny_config(backend="triton", num_blocks=8, num_layers=1))
        runner.model.to(torch.bfloat16)  # a GPU's dtype, where the prologue rounds (the CPU runner's is fp32)
        return feed(runner, {"A": list(prompt(3, 10))}, {"A": (8, 1, 1)})[0]["A"]

    fused = logits()
    assert len(launches) == 2 * 4  # decode steps x folds
    monkeypatch.setattr(gemv_fused, "prologue_config", lambda n, k, rows: None)
    assert torch.equal(fused, logits())
    assert len(launches) == 8
