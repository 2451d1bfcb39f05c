"""The engine's configuration: the KV cache, the scheduler, tensor parallelism and `EngineConfig`,
which holds them with the model and speculative decoding and validates every combination."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from server.config.device import ATTENTION_BACKENDS, DEVICES, resolve_backend, resolve_device
from server.config.flags import cli, require
from server.config.model import ModelChoice, ModelConfig, validate_model
from server.config.speculative import SpeculativeConfig

KV_CACHE_DTYPES = ("bf16", "fp8")
INDEXER_KEY_DTYPES = ("fp8", "mxfp4")
OVERLAP_MODES = ("auto", "on", "off")
LONG_PREFILL_SHARE = 8  # --long-prefill-tokens' default: the step's token budget over this


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
    # None: LONG_PREFILL_SHARE of the step's budget (`long_prefill_chunk`).
    long_prefill_tokens: int | None = field(default=None, metadata=cli(
        "--long-prefill-tokens", metavar="N",
        help="while requests wait to be admitted, a prompt prefills at most N tokens a step before the "
             "others are served, and only then takes the budget they leave; 0: no limit (first come, "
             "first served: a long prompt holds up every request behind it)",
        default_text=f"--max-num-batched-tokens // {LONG_PREFILL_SHARE}"))

    @property
    def long_prefill_chunk(self) -> int:
        """A prefill's first share of a step's budget while others wait (the budget when unlimited)."""
        if self.long_prefill_tokens is None:
            return max(1, self.max_num_batched_tokens // LONG_PREFILL_SHARE)
        return self.long_prefill_tokens or self.max_num_batched_tokens


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


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=lambda: ModelChoice().build())
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = field(default="auto", metadata=cli(
        "--device", choices=DEVICES, help="auto, cpu or cuda (auto: cuda when a GPU is visible)"))
    attention_backend: str = field(default="auto", metadata=cli(
        "--attention-backend", choices=ATTENTION_BACKENDS,
        help="kernel backend: triton, torch, or gluon (the Gluon sparse-MLA kernel on sm_90 (Hopper) or gfx942 "
        "(CDNA3, never tested on AMD hardware), Triton for the other ops; kernels/sparse_mla_gluon.py) "
        "(auto: triton on CUDA, torch on CPU)"))
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
        # The one place the sub-configs given without a block size or context length get the model
        # preset's: every reader sees the resolved value.
        if self.cache.block_size is None:
            block_size = self.model.default_block_size
            object.__setattr__(self, "cache", dataclasses.replace(self.cache, block_size=block_size))
        if self.scheduler.max_model_len is None:
            max_model_len = self.model.max_position
            object.__setattr__(self, "scheduler", dataclasses.replace(self.scheduler, max_model_len=max_model_len))
        validate_engine_config(self)

    @property
    def block_size(self) -> int:
        """KV block size in tokens: --block-size, else the model preset's."""
        assert self.cache.block_size is not None  # __post_init__ filled in the preset's
        return self.cache.block_size

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output in tokens: --max-model-len, else the model's max position."""
        assert self.scheduler.max_model_len is not None  # __post_init__ filled in the model's
        return self.scheduler.max_model_len

    @property
    def num_speculative_tokens(self) -> int:
        """Drafts a request verifies per step: k, or 0 without speculative decoding."""
        return 0 if self.speculative is None else self.speculative.num_speculative_tokens

    @property
    def max_step_outputs(self) -> int:
        """The most tokens one step hands on to the next (overlapped scheduling's placeholders): a
        token per request and, with speculative decoding, its drafts."""
        return self.scheduler.max_num_seqs * (1 + self.num_speculative_tokens)


def resolve_overlap(c: EngineConfig) -> bool:
    """Whether the engine overlaps scheduling with the device. 'auto' overlaps on CUDA only (a CPU
    runs each step as it is launched, so there is nothing to hide and the tokens would reach the
    client a step late), and not with standard speculative verification or TP, where it is not
    built (there validate_engine_config refuses 'on')."""
    if c.overlap_schedule != "auto":
        return c.overlap_schedule == "on"
    return (resolve_device(c.device) == "cuda" and (c.speculative is None or c.speculative.synthetic)
            and c.parallel.tensor_parallel_size == 1)


def validate_engine_config(c: EngineConfig) -> None:
    """Raise ValueError naming the flag for any invalid value or combination."""
    m, cache, sched = c.model, c.cache, c.scheduler
    validate_model(m)
    require(c.device in DEVICES, f"--device: must be one of {', '.join(DEVICES)}, got {c.device!r}")
    require(c.overlap_schedule in OVERLAP_MODES,
            f"--overlap-schedule: must be one of {', '.join(OVERLAP_MODES)}, got {c.overlap_schedule!r}")
    # 'auto' quietly stays off where overlap is not built; an explicit 'on' that cannot happen is refused
    require(c.overlap_schedule != "on" or c.speculative is None or c.speculative.synthetic,
            "--overlap-schedule on: not available with standard speculative verification (the verify "
            "step decides its accepted tokens on the device, and the next step is scheduled from them); "
            "use auto or off, or synthetic acceptance")
    require(c.overlap_schedule != "on" or c.parallel.tensor_parallel_size == 1,
            f"--overlap-schedule on: not available with --tp {c.parallel.tensor_parallel_size} (ranks "
            "follow the driver one step at a time); use auto or off")
    require(c.attention_backend in ATTENTION_BACKENDS,
            f"--attention-backend: must be one of {', '.join(ATTENTION_BACKENDS)}, got {c.attention_backend!r}")
    require(cache.kv_cache_dtype in KV_CACHE_DTYPES,
            f"--kv-cache-dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got {cache.kv_cache_dtype!r}")
    require(cache.indexer_key_dtype in INDEXER_KEY_DTYPES,
            f"--indexer-key-dtype: must be one of {', '.join(INDEXER_KEY_DTYPES)}, got {cache.indexer_key_dtype!r}")
    if m.name == "tiny":
        require(c.block_size > 0 and c.block_size % 16 == 0,
                f"--block-size: must be a positive multiple of 16 on the tiny model, got {c.block_size}")
    else:
        require(c.block_size in (64, 128), f"--block-size: must be 64 or 128 on the {m.name} model, got {c.block_size}")
    require(cache.kv_cache_dtype != "fp8" or m.kv_lora_rank % 128 == 0,
            f"--kv-cache-dtype fp8: the fp8_ds_mla layout needs kv_lora_rank % 128 == 0, got {m.kv_lora_rank}")
    require(cache.indexer_key_dtype != "mxfp4" or m.index_head_dim % 32 == 0,
            f"--indexer-key-dtype mxfp4: needs index_head_dim % 32 == 0, got {m.index_head_dim}")
    require(0.0 < cache.gpu_memory_utilization <= 1.0,
            f"--gpu-memory-utilization: must be in (0, 1], got {cache.gpu_memory_utilization}")
    require(cache.kv_cache_gb > 0, f"--kv-cache-gb: must be positive, got {cache.kv_cache_gb}")
    require(all(n > 0 for n in c.cuda_graph_sizes),
            f"--cuda-graph-sizes: every size must be positive, got {list(c.cuda_graph_sizes)}")
    require(cache.num_blocks is None or cache.num_blocks > 0,
            f"num_blocks: must be positive, got {cache.num_blocks}")
    require(sched.max_num_seqs > 0, f"--max-num-seqs: must be positive, got {sched.max_num_seqs}")
    require(sched.max_num_batched_tokens >= sched.max_num_seqs,
            f"--max-num-batched-tokens: must be at least --max-num-seqs ({sched.max_num_seqs}) so every "
            f"running request can decode in one step, got {sched.max_num_batched_tokens}")
    require(sched.long_prefill_tokens is None or sched.long_prefill_tokens >= 0,
            f"--long-prefill-tokens: must be >= 0 (0: no limit), got {sched.long_prefill_tokens}")
    require(0 < c.max_model_len <= m.max_position,
            f"--max-model-len: must be in 1..{m.max_position} for the {m.name} model, got {c.max_model_len}")
    require(c.weights is None or os.path.isfile(c.weights), f"--weights: no such file {c.weights!r}")
    require(c.step_delay_ms >= 0, f"--step-delay-ms: must be >= 0, got {c.step_delay_ms}")
    _validate_parallel(c)
    device = resolve_device(c.device)
    if device == "cuda":
        import torch

        require(torch.cuda.is_available(), "--device cuda: no CUDA device is available")
    if c.attention_backend == "gluon":
        require(device == "cuda", "--attention-backend gluon: needs --device cuda (Gluon kernels do not run on CPU)")
        _require_gluon(m)
    if resolve_backend(c.attention_backend, c.device) == "triton" and device == "cpu":
        require(os.environ.get("TRITON_INTERPRET") == "1",
                "--attention-backend triton on CPU needs TRITON_INTERPRET=1 in the environment")


def _require_gluon(m: ModelConfig) -> None:
    """The Gluon sparse-MLA kernel must run on this GPU and fit the model's latent and rope widths."""
    import torch

    from kernels.sparse_mla_gluon import check_gluon_shapes, gluon_unavailable_reason

    why = gluon_unavailable_reason(torch.device("cuda"))
    require(why is None, f"--attention-backend gluon: the Gluon sparse-MLA kernel cannot run here: {why}")
    try:
        check_gluon_shapes(m.kv_lora_rank, m.qk_rope_dim)
    except ValueError as exc:
        raise ValueError(f"--attention-backend gluon: the {m.name} model's shapes: {exc}") from None


def _validate_parallel(c: EngineConfig) -> None:
    p, m = c.parallel, c.model
    tp = p.tensor_parallel_size
    require(tp >= 1, f"--tp: must be at least 1, got {tp}")
    require(m.num_heads % tp == 0, f"--tp {tp}: must divide the attention heads ({m.num_heads})")
    require(m.index_num_heads % tp == 0, f"--tp {tp}: must divide the indexer heads ({m.index_num_heads})")
    require(m.intermediate_size % tp == 0, f"--tp {tp}: must divide the FFN width ({m.intermediate_size})")
    require(m.vocab_size % tp == 0, f"--tp {tp}: must divide the vocabulary ({m.vocab_size})")
    require(p.nnodes >= 1 and tp % p.nnodes == 0,
            f"--nnodes: must be at least 1 and divide --tp ({tp}), got {p.nnodes}")
    require(0 <= p.node_rank < p.nnodes, f"--node-rank: must be in 0..{p.nnodes - 1}, got {p.node_rank}")
    require(0 < p.master_port < 65536, f"--master-port: must be a TCP port, got {p.master_port}")


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
