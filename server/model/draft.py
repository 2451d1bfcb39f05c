"""The speculative draft head: one MTP-style layer on the target's last hidden state.

One pass turns (h, t) - the target's final hidden state at position p and the token at p + 1 -
into a guess for the token at p + 2:

    h' = proj([RMSNorm(h) ; RMSNorm(embed(t))])      (2 x hidden -> hidden)
    h' = h' + SwiGLU(RMSNorm(h'))
    logits = lm_head(final_norm(h'))                 (the target's own norm and LM head)

`propose` chains k passes, each feeding its h' and its token to the next, so k drafts cost k
tiny sequential passes. The layer has no attention sub-layer on purpose: it then needs no KV
cache of its own (nothing to allocate, roll back or preempt) and its few weights stay
replicated on every rank under tensor parallelism. The embedding and LM head are the target's,
shared, not copied. Weights are seeded random like the target's (a seed derived from the
engine seed), so with random weights drafts rarely match the target: `standard` verification
is still exact, and `synthetic` acceptance does not look at draft content.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from server.config import ModelConfig
from server.distributed.collectives import TensorParallel
from server.model.layers import RMSNorm, SwiGLU, init_linear
from server.model.model import SparseMLAModel

_SEED_OFFSET = 0x5EED  # the draft's weights must not repeat the target's random stream


class DraftHead(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.embed_norm = RMSNorm(h, config.rms_norm_eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.mlp_norm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = SwiGLU(h, config.intermediate_size, TensorParallel())  # world size 1: replicated

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, target: SparseMLAModel,
                backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, H], token_ids [B] -> (next hidden [B, H], logits fp32 [B, V]); backend: the
        engine's kernels (None: kernels.get_backend())."""
        x = self.proj(torch.cat((self.hidden_norm(hidden), self.embed_norm(target.embed(token_ids))), dim=-1))
        x = x + self.mlp(self.mlp_norm.project(x, self.mlp.gate_up.weight, backend), backend)
        return x, target.logits(target.norm(x), backend)

    @torch.inference_mode()
    def propose(self, hidden: torch.Tensor, token_ids: torch.Tensor, target: SparseMLAModel, k: int,
                choose: Callable[[torch.Tensor, int], torch.Tensor], backend: str | None = None) -> torch.Tensor:
        """k drafts per row, int64 [B, k] on the device. `choose(logits, i)` picks draft i's
        tokens from its logits (greedy or sampled, the caller's policy)."""
        drafts = []
        for i in range(k):
            hidden, logits = self(hidden, token_ids, target, backend)
            token_ids = choose(logits, i)
            drafts.append(token_ids)
        return torch.stack(drafts, dim=1)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        device = next(self.parameters()).device
        g = torch.Generator(device=device)
        g.manual_seed(seed + _SEED_OFFSET)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                # The MLP's output is a residual branch: keep it small as in the target.
                init_linear(module, g, 0.5 if name == "mlp.w_down" else 1.0)


def build_draft_head(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int) -> DraftHead:
    with torch.device(device):
        head = DraftHead(config)
    head.init_random(seed)
    return head.to(dtype).eval().requires_grad_(False)
