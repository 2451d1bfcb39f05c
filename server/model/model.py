"""The sparse-MLA decoder: embedding, L x (RMSNorm, MLA + indexer, RMSNorm, SwiGLU), norm, LM head.

Weights are seeded random by default, drawn so that activations keep a sane scale through the
layers (std 1/sqrt(fan_in) per projection; the residual-branch outputs shrunk by 1/sqrt(2L)),
or loaded from a safetensors file written by `save_weights`. Under tensor parallelism every rank
draws (or loads) the full tensors and keeps its slice, so the sharded model computes the same
function as the unsharded one for the same seed or file.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from server.config import ModelConfig
from server.distributed.collectives import TensorParallel
from server.model.attention import AttentionMetadata, CacheSettings, MLAttention
from server.model.layers import (
    ColumnParallelLinear,
    RMSNorm,
    RopeAngles,
    Rotary,
    SwiGLU,
    copy_shard,
    full_shape,
    init_linear,
)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attn = MLAttention(c, tp)
        self.mlp_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, tp)

    def forward(self, update: torch.Tensor | None, residual: torch.Tensor, rope: RopeAngles, meta: AttentionMetadata,
                kv: torch.Tensor, idx: torch.Tensor, s: CacheSettings) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it) from the previous layer's: each
        sub-layer's output joins the residual stream in the next norm, and each norm runs with the
        projection that reads it (one kernel at batch 1, see RMSNorm.add_project)."""
        inputs, residual = self.attn_norm.add_project(update, residual, self.attn.input_proj.weight, s.backend)
        update = self.attn(inputs, rope, meta, kv, idx, s)
        gate_up, residual = self.mlp_norm.add_project(update, residual, self.mlp.gate_up.weight, s.backend)
        return self.mlp(gate_up, s.backend), residual


class SparseMLAModel(nn.Module):
    def __init__(self, config: ModelConfig, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = tp or TensorParallel()
        # Replicated: a lookup costs nothing, and a vocabulary-split one would need an all-reduce.
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, self.tp) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = ColumnParallelLinear(config.hidden_size, config.vocab_size, self.tp)
        # Rank 0 of a group also keeps the whole LM head: the speculative draft head runs on
        # rank 0 alone and needs full logits without the other ranks (see `logits`).
        self.register_buffer("lm_head_full", None, persistent=False)
        self.rotary: Rotary  # built by `build_model` on the final device

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_caches: list[torch.Tensor],
                idx_caches: list[torch.Tensor], settings: CacheSettings) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm."""
        residual = self.embed(input_ids)
        rope = self.rotary.at(meta.positions)
        update = None
        for layer, kv, idx in zip(self.layers, kv_caches, idx_caches):
            update, residual = layer(update, residual, rope, meta, kv, idx, settings)
        return self.norm.add(update, residual, settings.backend)[0]

    def parallel_logits(self, hidden: torch.Tensor, backend: str | None = None) -> torch.Tensor | None:
        """Every rank at once: fp32 [N, vocab] on rank 0 (each rank's vocabulary slice, gathered);
        None on the other ranks. The forward pass's path. backend: the kernels' (None: get_backend())."""
        return self.tp.gather_last_dim(self.lm_head(hidden, backend, out_dtype=torch.float32))

    def logits(self, hidden: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        """fp32 [N, vocab] computed by this rank alone, no collective: rank 0's path for work the
        other ranks do not join (the speculative draft head)."""
        if self.tp.world_size == 1:
            return self.lm_head(hidden, backend, out_dtype=torch.float32)
        if self.lm_head_full is None:
            raise RuntimeError(f"logits: rank {self.tp.rank} holds only its slice of the LM head; use parallel_logits")
        return F.linear(hidden, self.lm_head_full).float()

    def _keep_full_head(self, full: torch.Tensor) -> None:
        if self.tp.world_size > 1 and self.tp.rank == 0:
            self.lm_head_full = full.to(self.lm_head.weight.device)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Fill every parameter from a generator seeded with `seed` on the parameters' device."""
        device = next(self.parameters()).device
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        residual_gain = 1.0 / math.sqrt(2 * self.config.num_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                out_proj = name.endswith(("attn.wo", "mlp.w_down"))
                full = init_linear(module, g, residual_gain if out_proj else 1.0)
                if module is self.lm_head:
                    self._keep_full_head(full)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0, generator=g)
            elif isinstance(module, (RMSNorm, nn.LayerNorm)):
                module.weight.fill_(1.0)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    bias.zero_()


def build_model(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int,
                weights: str | None = None, tp: TensorParallel | None = None) -> SparseMLAModel:
    """Allocate this rank's shard directly on `device` (no CPU copy), then random-init or load it."""
    with torch.device(device):
        model = SparseMLAModel(config, tp)
    if weights is None:
        model.init_random(seed)
    else:
        load_weights(model, weights)
    model.to(dtype)
    model.rotary = Rotary(config.qk_rope_dim, config.max_position, config.rope_theta, device)
    return model.eval().requires_grad_(False)


def save_weights(model: SparseMLAModel, path: str) -> None:
    """Write every parameter to a safetensors file (names as in the module tree); unsharded only."""
    if model.tp.world_size > 1:
        raise ValueError("save_weights: a tensor-parallel shard is not a whole model; save at --tp 1")
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    save_file(tensors, path, metadata={"model": model.config.name})


@torch.no_grad()
def load_weights(model: SparseMLAModel, path: str) -> None:
    """Copy a safetensors file of the whole model into `model` (this rank's slices of the split
    tensors); names and full shapes must match exactly."""
    try:
        tensors = load_file(path)
    except Exception as exc:  # safetensors raises several types for unreadable files
        raise ValueError(f"--weights {path}: cannot read safetensors file: {exc}") from exc
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"--weights {path}: tensor names do not match the {model.config.name} model: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    linears = {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    for name, target in expected.items():
        layer = linears.get(name)
        shape = full_shape(layer) if layer is not None else list(target.shape)
        if list(tensors[name].shape) != shape:
            raise ValueError(f"--weights {path}: tensor {name} has shape {list(tensors[name].shape)}, "
                             f"the model needs {shape}")
        if layer is not None:
            copy_shard(layer, tensors[name])
            if layer is model.lm_head:
                model._keep_full_head(tensors[name])
        else:
            target.copy_(tensors[name])
