"""Server configuration: model presets, cache, scheduler, parallelism, speculative decoding, HTTP.

The frozen dataclasses here are the only home of every default of `server start` and the engine. A field that is also a
command-line flag carries its flag in `metadata=cli(...)` (name, help, choices); server/args.py
builds argparse from those fields, so adding a flag is adding one field here. `server start`,
`loadgen bench` and `python -m server.parallel` share that one definition, and validation errors
name the flag. Model shapes follow docs/sparse_mla.md; FFN widths and vocab sizes are ours (the
model is random by default, so they only set the cost of the dense parts):

- tiny  (CPU, CI):   hidden 256,  2 layers,  FFN 768   (3 x hidden),   vocab 1024
- small (one GPU):   hidden 2048, 8 layers,  FFN 5632  (~2.75 x hidden, Llama-like), vocab 32768
- v32   (V3.2 attention shapes): hidden 7168, 4 layers by default, FFN 18432 (V3's dense FFN),
  vocab 129280

Token ids 0..255 are bytes, BOS = 256, EOS = 257 in every preset.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from golden_al import CurveError, load_curve, min_variance_rates, validate_rates
from golden_al.schedules import check_al

MODEL_PRESETS = ("tiny", "small", "v32")
KV_CACHE_DTYPES = ("bf16", "fp8")
INDEXER_KEY_DTYPES = ("fp8", "mxfp4")
DEVICES = ("auto", "cpu", "cuda")
OVERLAP_MODES = ("auto", "on", "off")
ATTENTION_BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True, slots=True)
class Flag:
    """How a config field appears on the command line; argparse's dest is the field's name.

    The type comes from the field's annotation (a bool field is a switch that flips its default),
    the default from the field's default; a field of another type (e.g. `tuple[int, ...]`) names
    the function that reads its value in `parse`. A new flag is one field, e.g.
    `enforce_eager: bool = field(default=False, metadata=cli("--enforce-eager", help="..."))`."""

    names: tuple[str, ...]
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    default_text: str | None = None  # "(default: ...)" when the value itself does not say it
    group: str = "engine"  # the --help section
    parse: Callable[[str], Any] | None = None


def cli(*names: str, help: str, choices: tuple[str, ...] | None = None, metavar: str | None = None,
        default_text: str | None = None, group: str = "engine",
        parse: Callable[[str], Any] | None = None) -> dict[str, Flag]:
    """Field metadata that makes the field a flag: `field(default=..., metadata=cli("--x", help=...))`."""
    return {"flag": Flag(names, help, choices, metavar, default_text, group, parse)}


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


def model_preset(name: str, **overrides: int) -> ModelConfig:
    """A preset with optional field overrides (e.g. num_layers=2), validated."""
    if name not in _PRESETS:
        raise ValueError(f"--model: unknown preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
    config = dataclasses.replace(_PRESETS[name], **overrides)
    _validate_model(config)
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
            _require(value > 0, f"{flag[key]}: must be positive, got {value}")
        return model_preset(self.model, **given)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    # None: the model preset's default_block_size (EngineConfig fills it in).
    block_size: int | None = field(default=None, metadata=cli(
        "--block-size", help="KV block size in tokens: 64 or 128; any multiple of 16 on tiny",
        default_text="the preset's, 16 on tiny, 64 otherwise"))
    kv_cache_dtype: str = field(default="bf16", metadata=cli(
        "--kv-cache-dtype", choices=KV_CACHE_DTYPES, help="latent KV rows: bf16 or fp8 (fp8_ds_mla layout)"))
    indexer_key_dtype: str = field(default="fp8", metadata=cli(
        "--indexer-key-dtype", choices=INDEXER_KEY_DTYPES, help="indexer key cache: fp8 or mxfp4"))
    gpu_memory_utilization: float = field(default=0.9, metadata=cli(
        "--gpu-memory-utilization", help="fraction of GPU memory for weights, activations and KV cache"))
    kv_cache_gb: float = field(default=0.25, metadata=cli(
        "--kv-cache-gb", help="KV cache size in GiB on CPU"))
    enable_prefix_caching: bool = field(default=True, metadata=cli(
        "--no-prefix-caching", help="disable prefix caching"))
    num_blocks: int | None = None  # fixed pool size (tests); overrides both sizing rules


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=64, metadata=cli(
        "--max-num-seqs", help="most requests running at once"))
    max_num_batched_tokens: int = field(default=2048, metadata=cli(
        "--max-num-batched-tokens", help="token budget of one engine step; longer prompts prefill in chunks"))
    # None: the model's max_position (EngineConfig fills it in).
    max_model_len: int | None = field(default=None, metadata=cli(
        "--max-model-len", help="longest prompt + output in tokens", default_text="the preset's max position"))


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """Tensor parallelism: one process per rank; rank 0 is the engine core (see server/distributed/)."""

    tensor_parallel_size: int = field(default=1, metadata=cli(
        "--tp", "--tensor-parallel-size", metavar="N", group="tensor parallelism",
        help="shard the model over this many GPUs (or CPU processes with gloo)"))
    nnodes: int = field(default=1, metadata=cli(
        "--nnodes", group="tensor parallelism", help="nodes in the tensor-parallel group"))
    node_rank: int = field(default=0, metadata=cli(
        "--node-rank", group="tensor parallelism", help="this node's rank"))
    master_addr: str = field(default="127.0.0.1", metadata=cli(
        "--master-addr", group="tensor parallelism",
        help="address of rank 0 for torch.distributed rendezvous, used with --nnodes > 1"))
    master_port: int = field(default=29513, metadata=cli(
        "--master-port", group="tensor parallelism",
        help="port of rank 0 for torch.distributed rendezvous, used with --nnodes > 1; "
             "a single node picks a free loopback port"))


SPEC_METHODS = ("mtp", "dspark")  # one mechanism: a one-layer draft head on the target's hidden state
REJECTION_SAMPLE_METHODS = ("synthetic", "standard")
_SPEC_KEYS = ("method", "num_speculative_tokens", "rejection_sample_method",
              "synthetic_acceptance_length", "synthetic_acceptance_rates")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's --speculative-config. `synthetic` acceptance draws each step's accepted-draft count
    from a per-position rate schedule (given as a mean AL, turned into vLLM's min-variance
    schedule, or as unconditional rates); `standard` verifies the drafts against the target."""

    method: str
    num_speculative_tokens: int  # k
    rejection_sample_method: str = "standard"
    synthetic_acceptance_length: float | None = None
    synthetic_acceptance_rates: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        validate_speculative_config(self)

    @property
    def synthetic(self) -> bool:
        return self.rejection_sample_method == "synthetic"

    @property
    def acceptance_rates(self) -> tuple[float, ...]:
        """Unconditional per-position rates of the synthetic schedule (empty for `standard`)."""
        if not self.synthetic:
            return ()
        if self.synthetic_acceptance_rates is not None:
            return self.synthetic_acceptance_rates
        return tuple(min_variance_rates(self.synthetic_acceptance_length, self.num_speculative_tokens))


def validate_speculative_config(s: SpeculativeConfig) -> None:
    flag = "--speculative-config"
    _require(s.method in SPEC_METHODS, f"{flag}: method must be one of {', '.join(SPEC_METHODS)}, got {s.method!r}")
    k = s.num_speculative_tokens
    _require(isinstance(k, int) and not isinstance(k, bool) and k >= 1,
             f"{flag}: num_speculative_tokens must be an integer >= 1, got {k!r}")
    _require(s.rejection_sample_method in REJECTION_SAMPLE_METHODS,
             f"{flag}: rejection_sample_method must be one of {', '.join(REJECTION_SAMPLE_METHODS)}, "
             f"got {s.rejection_sample_method!r}")
    al, rates = s.synthetic_acceptance_length, s.synthetic_acceptance_rates
    if not s.synthetic:
        _require(al is None and rates is None,
                 f"{flag}: synthetic_acceptance_length/rates need rejection_sample_method 'synthetic'")
        return
    _require(al is None or rates is None,
             f"{flag}: give exactly one of synthetic_acceptance_length and synthetic_acceptance_rates, not both")
    _require(al is not None or rates is not None,
             f"{flag}: rejection_sample_method 'synthetic' needs synthetic_acceptance_length or "
             f"synthetic_acceptance_rates (or --golden-al)")
    try:
        if al is not None:
            _require(isinstance(al, (int, float)) and not isinstance(al, bool),
                     f"synthetic_acceptance_length must be a number, got {al!r}")
            check_al(float(al), k)
        else:
            validate_rates(rates, k)
    except CurveError as exc:
        key = "synthetic_acceptance_length" if al is not None else "synthetic_acceptance_rates"
        raise ValueError(f"{flag}: {key}: {exc}") from None


def speculative_config_from_flags(text: str | None, golden_al: str | None,
                                  thinking: str | None) -> SpeculativeConfig | None:
    """--speculative-config JSON, optionally with the AL taken from a golden curve at its k."""
    if text is None:
        _require(golden_al is None, "--golden-al: needs --speculative-config with method and num_speculative_tokens")
        _require(thinking is None, "--thinking: only meaningful with --golden-al")
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config: not valid JSON: {exc}") from None
    _require(isinstance(obj, dict), "--speculative-config: must be a JSON object")
    unknown = sorted(set(obj) - set(_SPEC_KEYS))
    _require(not unknown, f"--speculative-config: unknown key(s) {unknown}; known: {', '.join(_SPEC_KEYS)}")
    for key in ("method", "num_speculative_tokens"):
        _require(key in obj, f"--speculative-config: missing {key!r}")
    rates = obj.get("synthetic_acceptance_rates")
    if rates is not None:
        _require(isinstance(rates, list) and all(isinstance(r, (int, float)) and not isinstance(r, bool)
                                                 for r in rates),
                 f"--speculative-config: synthetic_acceptance_rates must be a list of numbers, got {rates!r}")
        rates = tuple(float(r) for r in rates)
    al = obj.get("synthetic_acceptance_length")
    synthetic_given = al is not None or rates is not None
    if golden_al is not None:
        _require(not synthetic_given, "--golden-al: the curve gives the acceptance length; drop "
                                      "synthetic_acceptance_length/rates from --speculative-config")
        _require(obj.get("rejection_sample_method", "synthetic") == "synthetic",
                 "--golden-al: needs rejection_sample_method 'synthetic'")
        k = obj["num_speculative_tokens"]
        _require(isinstance(k, int) and not isinstance(k, bool) and k >= 1,
                 f"--speculative-config: num_speculative_tokens must be an integer >= 1, got {k!r}")
        try:
            al = load_curve(golden_al).al(k, (thinking or "on") == "on")
        except CurveError as exc:
            raise ValueError(f"--golden-al: {exc}") from None
        synthetic_given = True
    else:
        _require(thinking is None, "--thinking: only meaningful with --golden-al")
    return SpeculativeConfig(
        method=obj["method"], num_speculative_tokens=obj["num_speculative_tokens"],
        rejection_sample_method=obj.get("rejection_sample_method", "synthetic" if synthetic_given else "standard"),
        synthetic_acceptance_length=al, synthetic_acceptance_rates=rates,
    )


_SPEC_GROUP = "speculative decoding"


@dataclass(frozen=True, slots=True)
class SpeculativeFlags:
    """The command line's speculative-decoding flags, turned into a SpeculativeConfig by `build`."""

    speculative_config: str | None = field(default=None, metadata=cli(
        "--speculative-config", metavar="JSON", group=_SPEC_GROUP, default_text="off",
        help="vLLM's speculative config, e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 5, "
             "\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_length\": 3.51}'. "
             "method: mtp or dspark (the same mechanism here: a one-layer draft head on the target's "
             "last hidden state); rejection_sample_method: synthetic (needs exactly one of "
             "synthetic_acceptance_length or synthetic_acceptance_rates, per-position unconditional, "
             "non-increasing, length k) or standard (greedy / rejection-sampling verification)"))
    golden_al: str | None = field(default=None, metadata=cli(
        "--golden-al", metavar="NAME|FILE", group=_SPEC_GROUP,
        help="take the synthetic acceptance length at num_speculative_tokens from this golden curve "
             "(bundled name, see `loadgen golden-al list`, or a YAML file)"))
    thinking: str | None = field(default=None, metadata=cli(
        "--thinking", choices=("on", "off"), group=_SPEC_GROUP, default_text="on",
        help="with --golden-al: the curve's thinking_on or thinking_off AL"))

    def build(self) -> SpeculativeConfig | None:
        return speculative_config_from_flags(self.speculative_config, self.golden_al, self.thinking)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=lambda: ModelChoice().build())
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = field(default="auto", metadata=cli(
        "--device", choices=DEVICES, help="auto, cpu or cuda (auto: cuda when a GPU is visible)"))
    attention_backend: str = field(default="auto", metadata=cli(
        "--attention-backend", choices=ATTENTION_BACKENDS,
        help="kernel backend: triton or torch (auto: triton on CUDA, torch on CPU)"))
    seed: int = field(default=0, metadata=cli("--seed", help="seed of the random weights"))
    weights: str | None = field(default=None, metadata=cli(
        "--weights", help="safetensors file to load", default_text="seeded random"))
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
    step_delay_ms: float = field(default=0.0, metadata=cli(
        "--step-delay-ms", metavar="MS",
        help="test only: add this delay to every engine step that runs a batch, a known slowdown "
             "for A/B calibration"))
    enforce_eager: bool = field(default=False, metadata=cli(
        "--enforce-eager", default_text="capture on CUDA",
        help="run every step eagerly: no CUDA-graph capture of the decode step"))
    overlap_schedule: str = field(default="auto", metadata=cli(
        "--overlap-schedule", choices=OVERLAP_MODES,
        help="on: the host prepares the next step while the device runs this one; off: each step is "
             "scheduled only after the previous step's tokens are back; auto: on for CUDA, off on CPU "
             "(the CPU runs a step as it is launched, so there is nothing to hide, and the tokens would "
             "only reach the client a step late). Not built for standard speculative verification or --tp > 1: "
             "auto is off there and on is refused (synthetic acceptance overlaps)"))
    cuda_graph_sizes: tuple[int, ...] = field(default=(), metadata=cli(
        "--cuda-graph-sizes", metavar="N,N,...", parse=lambda text: _int_list(text, "--cuda-graph-sizes"),
        default_text="1, 2, 4, 8, 16, 24, ... up to --max-num-seqs",
        help="decode batch sizes to capture as CUDA graphs"))

    def __post_init__(self) -> None:
        # The cache's block size and the context length default to the model preset's.
        if self.cache.block_size is None:
            object.__setattr__(self, "cache", dataclasses.replace(
                self.cache, block_size=self.model.default_block_size))
        if self.scheduler.max_model_len is None:
            object.__setattr__(self, "scheduler", dataclasses.replace(
                self.scheduler, max_model_len=self.model.max_position))
        validate_engine_config(self)

    @property
    def num_speculative_tokens(self) -> int:
        """Drafts a request verifies per step: k, or 0 without speculative decoding."""
        return 0 if self.speculative is None else self.speculative.num_speculative_tokens

    @property
    def max_step_outputs(self) -> int:
        """The most tokens one step hands on to the next (overlapped scheduling's placeholders): a
        token per request and, with speculative decoding, its drafts."""
        return self.scheduler.max_num_seqs * (1 + self.num_speculative_tokens)


def resolve_device(device: str) -> str:
    """'auto' becomes 'cuda' when a GPU is visible, else 'cpu'."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_overlap(c: EngineConfig) -> bool:
    """Whether the engine overlaps scheduling with the device. 'auto' overlaps on CUDA only (a CPU
    runs each step as it is launched, so there is nothing to hide and the tokens would reach the
    client a step late), and not with standard speculative verification or TP, where it is not
    built (there validate_engine_config refuses 'on')."""
    if c.overlap_schedule != "auto":
        return c.overlap_schedule == "on"
    return (resolve_device(c.device) == "cuda" and (c.speculative is None or c.speculative.synthetic)
            and c.parallel.tensor_parallel_size == 1)


def resolve_backend(backend: str, device: str) -> str:
    if backend != "auto":
        return backend
    return "triton" if resolve_device(device) == "cuda" else "torch"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _validate_model(m: ModelConfig) -> None:
    for name in ("hidden_size", "num_layers", "num_heads", "q_lora_rank", "kv_lora_rank",
                 "qk_nope_dim", "qk_rope_dim", "v_head_dim", "index_num_heads",
                 "index_head_dim", "index_topk", "intermediate_size", "vocab_size"):
        _require(getattr(m, name) > 0, f"--{name.replace('_', '-')}: must be positive, got {getattr(m, name)}")
    _require(m.vocab_size > m.eos_token_id,
             f"--vocab-size: must exceed the EOS id {m.eos_token_id}, got {m.vocab_size}")
    _require(m.qk_rope_dim % 2 == 0 and m.qk_rope_dim <= m.index_head_dim,
             "--qk-rope-dim: must be even and at most the indexer head dim")
    # tl.dot needs every contracted dim to be a multiple of 16 on NVIDIA and AMD.
    for name in ("kv_lora_rank", "qk_rope_dim", "index_head_dim"):
        _require(getattr(m, name) % 16 == 0, f"--{name.replace('_', '-')}: must be a multiple of 16")


def validate_engine_config(c: EngineConfig) -> None:
    """Raise ValueError naming the flag for any invalid value or combination."""
    m, cache, sched = c.model, c.cache, c.scheduler
    _validate_model(m)
    _require(c.device in DEVICES, f"--device: must be one of {', '.join(DEVICES)}, got {c.device!r}")
    _require(c.overlap_schedule in OVERLAP_MODES,
             f"--overlap-schedule: must be one of {', '.join(OVERLAP_MODES)}, got {c.overlap_schedule!r}")
    # 'auto' quietly stays off where overlap is not built; an explicit 'on' that cannot happen is refused
    _require(c.overlap_schedule != "on" or c.speculative is None or c.speculative.synthetic,
             "--overlap-schedule on: not available with standard speculative verification (the verify "
             "step decides its accepted tokens on the device, and the next step is scheduled from them); "
             "use auto or off, or synthetic acceptance")
    _require(c.overlap_schedule != "on" or c.parallel.tensor_parallel_size == 1,
             f"--overlap-schedule on: not available with --tp {c.parallel.tensor_parallel_size} (ranks "
             "follow the driver one step at a time); use auto or off")
    _require(c.attention_backend in ATTENTION_BACKENDS,
             f"--attention-backend: must be one of {', '.join(ATTENTION_BACKENDS)}, got {c.attention_backend!r}")
    _require(cache.kv_cache_dtype in KV_CACHE_DTYPES,
             f"--kv-cache-dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got {cache.kv_cache_dtype!r}")
    _require(cache.indexer_key_dtype in INDEXER_KEY_DTYPES,
             f"--indexer-key-dtype: must be one of {', '.join(INDEXER_KEY_DTYPES)}, got {cache.indexer_key_dtype!r}")
    if m.name == "tiny":
        _require(cache.block_size > 0 and cache.block_size % 16 == 0,
                 f"--block-size: must be a positive multiple of 16 on the tiny model, got {cache.block_size}")
    else:
        _require(cache.block_size in (64, 128),
                 f"--block-size: must be 64 or 128 on the {m.name} model, got {cache.block_size}")
    _require(cache.kv_cache_dtype != "fp8" or m.kv_lora_rank % 128 == 0,
             f"--kv-cache-dtype fp8: the fp8_ds_mla layout needs kv_lora_rank % 128 == 0, got {m.kv_lora_rank}")
    _require(cache.indexer_key_dtype != "mxfp4" or m.index_head_dim % 32 == 0,
             f"--indexer-key-dtype mxfp4: needs index_head_dim % 32 == 0, got {m.index_head_dim}")
    _require(0.0 < cache.gpu_memory_utilization <= 1.0,
             f"--gpu-memory-utilization: must be in (0, 1], got {cache.gpu_memory_utilization}")
    _require(cache.kv_cache_gb > 0, f"--kv-cache-gb: must be positive, got {cache.kv_cache_gb}")
    _require(all(n > 0 for n in c.cuda_graph_sizes),
             f"--cuda-graph-sizes: every size must be positive, got {list(c.cuda_graph_sizes)}")
    _require(cache.num_blocks is None or cache.num_blocks > 0,
             f"num_blocks: must be positive, got {cache.num_blocks}")
    _require(sched.max_num_seqs > 0, f"--max-num-seqs: must be positive, got {sched.max_num_seqs}")
    _require(sched.max_num_batched_tokens >= sched.max_num_seqs,
             f"--max-num-batched-tokens: must be at least --max-num-seqs ({sched.max_num_seqs}) so every "
             f"running request can decode in one step, got {sched.max_num_batched_tokens}")
    _require(0 < sched.max_model_len <= m.max_position,
             f"--max-model-len: must be in 1..{m.max_position} for the {m.name} model, got {sched.max_model_len}")
    _require(c.weights is None or os.path.isfile(c.weights), f"--weights: no such file {c.weights!r}")
    _require(c.step_delay_ms >= 0, f"--step-delay-ms: must be >= 0, got {c.step_delay_ms}")
    _validate_parallel(c)
    device = resolve_device(c.device)
    if device == "cuda":
        import torch

        _require(torch.cuda.is_available(), "--device cuda: no CUDA device is available")
    if resolve_backend(c.attention_backend, c.device) == "triton" and device == "cpu":
        _require(os.environ.get("TRITON_INTERPRET") == "1",
                 "--attention-backend triton on CPU needs TRITON_INTERPRET=1 in the environment")


def _validate_parallel(c: EngineConfig) -> None:
    p, m = c.parallel, c.model
    tp = p.tensor_parallel_size
    _require(tp >= 1, f"--tp: must be at least 1, got {tp}")
    _require(m.num_heads % tp == 0, f"--tp {tp}: must divide the attention heads ({m.num_heads})")
    _require(m.index_num_heads % tp == 0, f"--tp {tp}: must divide the indexer heads ({m.index_num_heads})")
    _require(m.intermediate_size % tp == 0, f"--tp {tp}: must divide the FFN width ({m.intermediate_size})")
    _require(m.vocab_size % tp == 0, f"--tp {tp}: must divide the vocabulary ({m.vocab_size})")
    _require(p.nnodes >= 1 and tp % p.nnodes == 0,
             f"--nnodes: must be at least 1 and divide --tp ({tp}), got {p.nnodes}")
    _require(0 <= p.node_rank < p.nnodes, f"--node-rank: must be in 0..{p.nnodes - 1}, got {p.node_rank}")
    _require(0 < p.master_port < 65536, f"--master-port: must be a TCP port, got {p.master_port}")


_HTTP = "HTTP"
API_KEY_ENV = "AGENTLOAD_API_KEY"  # the API key, when neither --api-key nor --api-key-file gives it


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """`server start`'s HTTP side: where it listens, who may call it, how much it queues."""

    host: str = field(default="127.0.0.1", metadata=cli("--host", group=_HTTP, help="address to bind"))
    port: int = field(default=8000, metadata=cli(
        "--port", group=_HTTP, help="port to bind; 0 picks a free one, printed on the ready line"))
    api_key: str | None = field(default=None, metadata=cli(
        "--api-key", group=_HTTP, default_text=f"${API_KEY_ENV}, else none",
        help="require 'Authorization: Bearer KEY' on /v1 routes (a command line is visible to other "
             f"users in ps: prefer --api-key-file or ${API_KEY_ENV})"))
    api_key_file: str | None = field(default=None, metadata=cli(
        "--api-key-file", group=_HTTP, metavar="PATH", help="read --api-key's KEY from PATH (one line)"))
    max_body_mb: float = field(default=32.0, metadata=cli(
        "--max-body-mb", group=_HTTP, help="largest request body in MiB; larger ones get 413"))
    max_queue: int = field(default=1024, metadata=cli(
        "--max-queue", group=_HTTP,
        help="requests allowed to wait beyond --max-num-seqs running ones; more get 503 with Retry-After"))
    served_model_name: str | None = field(default=None, metadata=cli(
        "--served-model-name", group=_HTTP, default_text="the preset name",
        help="model id in /v1/models and responses"))
    shutdown_timeout: float = field(default=30.0, metadata=cli(
        "--shutdown-timeout", group=_HTTP,
        help="on SIGTERM/SIGINT, seconds to let running requests finish; then (or at a second signal) "
             "the rest are cut and the exit code is 3"))
    read_timeout: float = field(default=10.0, metadata=cli(
        "--read-timeout", group=_HTTP, metavar="S",
        help="a client must send a complete request head within S seconds of connecting (or of its "
             "previous response; idle keep-alive connections close then too) and its body within S more "
             "(else 408, and the connection closes S later at most)"))

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, f"--port: must be in 0..65535, got {self.port}")
        _require(math.isfinite(self.max_body_mb) and self.max_body_mb > 0,
                 f"--max-body-mb: must be a positive number, got {self.max_body_mb}")
        _require(self.max_queue >= 0, f"--max-queue: must be >= 0, got {self.max_queue}")
        _require(self.shutdown_timeout >= 0, f"--shutdown-timeout: must be >= 0, got {self.shutdown_timeout}")
        _require(self.api_key != "", "--api-key: must not be empty")
        _require(self.api_key is None or self.api_key_file is None, "--api-key-file: give it or --api-key, not both")
        _require(self.read_timeout > 0, f"--read-timeout: must be > 0, got {self.read_timeout}")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)

    def read_api_key(self) -> str | None:
        """The key /v1 routes require: --api-key, else the one line of --api-key-file, else
        $AGENTLOAD_API_KEY if set and not empty; None: no key."""
        if self.api_key_file is None:
            return self.api_key or os.environ.get(API_KEY_ENV) or None
        try:
            with open(self.api_key_file, encoding="utf-8") as file:
                key = file.read().strip()
        except OSError as exc:
            raise ValueError(f"--api-key-file: cannot read {self.api_key_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--api-key-file: {self.api_key_file} is not UTF-8 text") from None
        _require(key != "" and "\n" not in key, f"--api-key-file: {self.api_key_file} must hold the key on one line")
        return key


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
