"""Comparison helpers for the kernel tests (the bars of docs/sparse_mla.md)."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2<x,y>/(|x|^2+|y|^2), the similarity measure of the FlashMLA / DeepGEMM tests."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denom) if denom > 0 else 0.0


def assert_logits_match(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Indexer bar: -inf mask exact, finite part relative difference < 5e-6, nothing NaN."""
    assert not torch.isnan(got).any(), "NaN in logits (an element was not written?)"
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), "-inf mask differs"
    finite = torch.isfinite(ref)
    assert calc_diff(got[finite], ref[finite]) < 5e-6
    if finite.any():
        scale = float(ref[finite].abs().max())
        assert torch.allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-5 * scale)


def assert_mla_match(out: torch.Tensor, lse: torch.Tensor, ref: torch.Tensor, ref_lse: torch.Tensor) -> None:
    """Sparse MLA bar: per element abs 1e-3 or rel 2/128, cosine difference < 5e-6, lse abs 1e-6."""
    o, r = out.float(), ref.float()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "NaN in output (an element was not written?)"
    assert ((o - r).abs() <= torch.maximum(torch.full_like(r, 1e-3), r.abs() * (2 / 128))).all()
    assert calc_diff(o, r) < 5e-6
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    if finite.any():
        # abs 1e-6 per unit of |lse|: fp32 cannot resolve finer than that
        assert float((lse[finite] - ref_lse[finite]).abs().max()) <= 1e-6 * max(1.0, float(ref_lse[finite].abs().max()))


def selected_values(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per row, the sorted logits at the selected indices (padding -1 left out as -inf)."""
    vals = torch.gather(logits, 1, idx.long().clamp(min=0))
    return torch.where(idx >= 0, vals, float("-inf")).sort(dim=1).values
