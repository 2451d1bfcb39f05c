"""The top-k's torch reference, the torch backend's path: torch.topk behind a length mask."""

from __future__ import annotations

import torch


def topk_indices_torch(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """Reference: torch.topk over each row's first lengths[t] columns, short rows 0..len-1 then -1.

    Columns past a row's length rank as -inf and an -inf inside it as the lowest finite fp32 value,
    so a row with fewer than k finite values still selects only columns inside its length (the one
    order this changes, an -inf tied with -3.4e38, never reaches the engine: its indexer logits are
    finite). One elementwise pass more than masking alone, where an exact integer key would take
    four."""
    t, n = logits.shape
    lengths = lengths.long()
    out = torch.full((t, k), -1, dtype=torch.int32, device=logits.device)
    col = torch.arange(n, device=logits.device)
    inside = logits.float().clamp_min(torch.finfo(torch.float32).min)  # NaN stays NaN
    masked = torch.where(col[None, :] < lengths[:, None], inside, float("-inf"))
    if n:
        _, idx = masked.topk(min(k, n), dim=1)
        out[:, : idx.shape[1]] = idx.int()
    short = lengths <= k
    slot = torch.arange(k, device=logits.device)
    ramp = torch.where(slot[None, :] < lengths[:, None], slot[None, :], -1).int()
    return torch.where(short[:, None], ramp, out)
