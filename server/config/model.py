"""The model's shapes: `ModelConfig`, the presets `--model` picks, and the flags that override them.

Shapes follow docs/sparse_mla.md; FFN widths and vocab sizes are ours (the model is random by
default, so they only set the cost of the dense parts):

- tiny  (CPU, CI):   hidden 256,  2 layers,  FFN 768   (3 x hidden),   vocab 1024
- small (one GPU):   hidden 2048, 8 layers,  FFN 5632  (~2.75 x hidden, Llama-like), vocab 32768
- v32   (V3.2 attention shapes): hidden 7168, 4 layers by default, FFN 18432 (V3's dense FFN),
  vocab 129280

Token ids 0..255 are bytes, BOS = 256, EOS = 257 in every preset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from server.config.flags import cli, require

MODEL_PRESETS = ("tiny", "small", "v32")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int  # d_c
    qk_nope_dim: int
    qk_rope_dim: int  # d_r
    v_head_dim: int
    index_num_heads: int
    index_head_dim: int
    index_topk: int  # K
    intermediate_size: int
    vocab_size: int
    max_position: int
    default_block_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 256
    eos_token_id: int = 257

    @property
    def softmax_scale(self) -> float:
        return float(self.qk_nope_dim + self.qk_rope_dim) ** -0.5

    @property
    def kv_row_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim


_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny", hidden_size=256, num_layers=2, num_heads=16, q_lora_rank=128,
        kv_lora_rank=128, qk_nope_dim=32, qk_rope_dim=32, v_head_dim=32, index_num_heads=4,
        index_head_dim=64, index_topk=32, intermediate_size=768, vocab_size=1024,
        max_position=8192, default_block_size=16,
    ),
    "small": ModelConfig(
        name="small", hidden_size=2048, num_layers=8, num_heads=16, q_lora_rank=512,
        kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, index_num_heads=16,
        index_head_dim=128, index_topk=512, intermediate_size=5632, vocab_size=32768,
        max_position=32768, default_block_size=64,
    ),
    "v32": ModelConfig(
        name="v32", hidden_size=7168, num_layers=4, num_heads=128, q_lora_rank=1536,
        kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, index_num_heads=64,
        index_head_dim=128, index_topk=2048, intermediate_size=18432, vocab_size=129280,
        max_position=163840, default_block_size=64,
    ),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset with optional field overrides (e.g. num_layers=2), validated."""
    if name not in _PRESETS:
        raise ValueError(f"--model: unknown preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
    config = dataclasses.replace(_PRESETS[name], **overrides)
    validate_model(config)
    return config


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """Which model to build: a preset and the overrides the command line may give."""

    model: str = field(default="tiny", metadata=cli(
        "--model", choices=MODEL_PRESETS, help="model preset (shapes in docs/sparse_mla.md)"))
    num_layers: int | None = field(default=None, metadata=cli(
        "--num-layers", help="override the preset's layer count"))
    num_heads: int | None = field(default=None, metadata=cli(
        "--num-heads", help="override the preset's attention heads (e.g. heads per GPU)"))
    top_k: int | None = field(default=None, metadata=cli(
        "--top-k", help="override the preset's sparse top-k K"))

    def build(self) -> ModelConfig:
        overrides = {"num_layers": self.num_layers, "num_heads": self.num_heads, "index_topk": self.top_k}
        flag = {"num_layers": "--num-layers", "num_heads": "--num-heads", "index_topk": "--top-k"}
        given = {key: value for key, value in overrides.items() if value is not None}
        for key, value in given.items():
            require(value > 0, f"{flag[key]}: must be positive, got {value}")
        return model_preset(self.model, **given)


def validate_model(m: ModelConfig) -> None:
    """Raise ValueError naming the flag for a shape the kernels cannot run."""
    for name in ("hidden_size", "num_layers", "num_heads", "q_lora_rank", "kv_lora_rank",
                 "qk_nope_dim", "qk_rope_dim", "v_head_dim", "index_num_heads",
                 "index_head_dim", "index_topk", "intermediate_size", "vocab_size"):
        require(getattr(m, name) > 0, f"--{name.replace('_', '-')}: must be positive, got {getattr(m, name)}")
    require(m.vocab_size > m.eos_token_id,
            f"--vocab-size: must exceed the EOS id {m.eos_token_id}, got {m.vocab_size}")
    require(m.qk_rope_dim % 2 == 0 and m.qk_rope_dim <= m.index_head_dim,
            "--qk-rope-dim: must be even and at most the indexer head dim")
    # tl.dot needs every contracted dim to be a multiple of 16 on NVIDIA and AMD.
    for name in ("kv_lora_rank", "qk_rope_dim", "index_head_dim"):
        require(getattr(m, name) % 16 == 0, f"--{name.replace('_', '-')}: must be a multiple of 16")

