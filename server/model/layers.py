"""Small building blocks of the model: RMSNorm, rotary embedding, SwiGLU MLP, scaled init."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary:
    """RoPE with theta; `interleaved` rotates pairs (x0, x1), (x2, x3)... (MLA's form), otherwise
    halves (x_i, x_{i+d/2}) (the indexer's form). Tables are fp32, built on the model's device."""

    def __init__(self, dim: int, max_position: int, theta: float, device: torch.device) -> None:
        inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
        self.cos = angles.cos().float().to(device)
        self.sin = angles.sin().float().to(device)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, interleaved: bool) -> torch.Tensor:
        """x [T, ..., dim] rotated by each token's position; same dtype out."""
        shape = (positions.shape[0],) + (1,) * (x.dim() - 2) + (-1,)
        cos, sin = self.cos[positions].view(shape), self.sin[positions].view(shape)
        xf = x.float()
        if interleaved:
            a, b = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        else:
            a, b = xf.chunk(2, dim=-1)
            out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
        return out.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(hidden, intermediate, bias=False)
        self.w_up = nn.Linear(hidden, intermediate, bias=False)
        self.w_down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def init_linear(layer: nn.Linear, generator: torch.Generator, gain: float = 1.0) -> None:
    """Normal init with std gain / sqrt(fan_in), so each projection keeps activations near unit scale."""
    with torch.no_grad():
        std = gain / math.sqrt(layer.weight.shape[1])
        layer.weight.normal_(0.0, std, generator=generator)
