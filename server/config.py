"""Engine configuration: model presets, cache, scheduler, and the command-line flags that build them.

`server start` and `loadgen bench` both call `add_engine_args` and `engine_config_from_args`, so
every engine flag is defined (and validated) once, here. Model shapes follow the table in
SPARSE_MLA.md; FFN widths and vocab sizes are ours (the model is random by default, so they only
set the cost of the dense parts):

- tiny  (CPU, CI):   hidden 256,  2 layers,  FFN 768   (3 x hidden),   vocab 1024
- small (one GPU):   hidden 2048, 8 layers,  FFN 5632  (~2.75 x hidden, Llama-like), vocab 32768
- v32   (V3.2 attention shapes): hidden 7168, 4 layers by default, FFN 18432 (V3's dense FFN),
  vocab 129280

Token ids 0..255 are bytes, BOS = 256, EOS = 257 in every preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field

from golden_al import CurveError, load_curve, min_variance_rates, validate_rates
from golden_al.schedules import check_al

MODEL_PRESETS = ("tiny", "small", "v32")
KV_CACHE_DTYPES = ("bf16", "fp8")
INDEXER_KEY_DTYPES = ("fp8", "mxfp4")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton")


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
class CacheConfig:
    block_size: int = 16
    kv_cache_dtype: str = "bf16"  # "bf16" or "fp8" (the fp8_ds_mla layout)
    indexer_key_dtype: str = "fp8"  # "fp8" or "mxfp4"
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory the engine may use in all
    kv_cache_gb: float = 0.25  # KV pool size on CPU
    enable_prefix_caching: bool = True
    num_blocks: int | None = None  # fixed pool size (tests); overrides both sizing rules


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """Tensor parallelism: one process per rank; rank 0 is the engine core (see server/parallel.py)."""

    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29513


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


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=lambda: model_preset("tiny"))
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"  # "auto", "cpu" or "cuda"
    attention_backend: str = "auto"  # "auto" (triton on CUDA, torch on CPU), "torch", "triton"
    seed: int = 0
    weights: str | None = None  # safetensors file; None means seeded random weights
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
    step_delay_ms: float = 0.0  # test-only: sleep this long in every step that runs a batch (planted A/B effect)
    enforce_eager: bool = False  # True: no CUDA graphs, every step runs eagerly
    cuda_graph_sizes: tuple[int, ...] = ()  # decode batch sizes captured; () = 1, 2, 4, 8, 16, ... to max_num_seqs

    def __post_init__(self) -> None:
        validate_engine_config(self)


def resolve_device(device: str) -> str:
    """'auto' becomes 'cuda' when a GPU is visible, else 'cpu'."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add every engine flag to `parser` (one argument group)."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="tiny", choices=MODEL_PRESETS,
                   help="model preset (SPARSE_MLA.md shapes; default: tiny)")
    g.add_argument("--num-layers", type=int, default=None, help="override the preset's layer count")
    g.add_argument("--num-heads", type=int, default=None,
                   help="override the preset's attention heads (e.g. heads per GPU)")
    g.add_argument("--top-k", type=int, default=None, help="override the preset's sparse top-k K")
    g.add_argument("--weights", default=None, help="safetensors file to load (default: seeded random)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    g.add_argument("--kv-cache-dtype", default="bf16", choices=KV_CACHE_DTYPES,
                   help="latent KV rows: bf16 or fp8 (fp8_ds_mla layout) (default: bf16)")
    g.add_argument("--indexer-key-dtype", default="fp8", choices=INDEXER_KEY_DTYPES,
                   help="indexer key cache: fp8 or mxfp4 (default: fp8)")
    g.add_argument("--block-size", type=int, default=None,
                   help="KV block size in tokens: 64 or 128; any multiple of 16 on tiny "
                        "(default: the preset's, 16 on tiny, 64 otherwise)")
    g.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                   help="kernel backend: triton or torch (default: triton on CUDA, torch on CPU)")
    g.add_argument("--device", default="auto", choices=DEVICES, help="auto, cpu or cuda (default: auto)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and KV cache (default: 0.9)")
    g.add_argument("--kv-cache-gb", type=float, default=0.25,
                   help="KV cache size in GiB on CPU (default: 0.25)")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    g.add_argument("--max-num-seqs", type=int, default=64,
                   help="most requests running at once (default: 64)")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget of one engine step; longer prompts prefill in chunks (default: 2048)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output in tokens (default: the preset's max position)")
    g.add_argument("--step-delay-ms", type=float, default=0.0,
                   help="test only: add this delay to every engine step that runs a batch, a known slowdown "
                        "for A/B calibration (default: 0)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="run every step eagerly: no CUDA-graph capture of the decode step (default: capture on CUDA)")
    g.add_argument("--cuda-graph-sizes", default=None, metavar="N,N,...",
                   help="decode batch sizes to capture as CUDA graphs (default: 1, 2, 4, 8, 16, 24, ... up to "
                        "--max-num-seqs)")
    s = parser.add_argument_group("speculative decoding")
    s.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="vLLM's speculative config, e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 5, "
                        "\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_length\": 3.51}'. "
                        "method: mtp or dspark (the same mechanism here: a one-layer draft head on the target's "
                        "last hidden state); rejection_sample_method: synthetic (needs exactly one of "
                        "synthetic_acceptance_length or synthetic_acceptance_rates, per-position unconditional, "
                        "non-increasing, length k) or standard (greedy / rejection-sampling verification) "
                        "(default: off)")
    s.add_argument("--golden-al", default=None, metavar="NAME|FILE",
                   help="take the synthetic acceptance length at num_speculative_tokens from this golden curve "
                        "(bundled name, see `loadgen golden-al list`, or a YAML file)")
    s.add_argument("--thinking", default=None, choices=("on", "off"),
                   help="with --golden-al: the curve's thinking_on or thinking_off AL (default: on)")
    t = parser.add_argument_group("tensor parallelism")
    t.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                   help="shard the model over this many GPUs (or CPU processes with gloo) (default: 1)")
    t.add_argument("--nnodes", type=int, default=1, help="nodes in the tensor-parallel group (default: 1)")
    t.add_argument("--node-rank", type=int, default=0, help="this node's rank (default: 0)")
    t.add_argument("--master-addr", default="127.0.0.1",
                   help="address of rank 0 for torch.distributed rendezvous, used with --nnodes > 1 "
                        "(default: 127.0.0.1)")
    t.add_argument("--master-port", type=int, default=29513,
                   help="port of rank 0 for torch.distributed rendezvous, used with --nnodes > 1; "
                        "a single node picks a free loopback port (default: 29513)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build and validate an EngineConfig from parsed `add_engine_args` flags."""
    overrides = {k: v for k, v in (("num_layers", args.num_layers), ("num_heads", args.num_heads),
                                   ("index_topk", args.top_k)) if v is not None}
    flag = {"num_layers": "--num-layers", "num_heads": "--num-heads", "index_topk": "--top-k"}
    for key, value in overrides.items():
        _require(value > 0, f"{flag[key]}: must be positive, got {value}")
    model = model_preset(args.model, **overrides)
    cache = CacheConfig(
        block_size=args.block_size if args.block_size is not None else model.default_block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        indexer_key_dtype=args.indexer_key_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_gb=args.kv_cache_gb,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len if args.max_model_len is not None else model.max_position,
    )
    parallel = ParallelConfig(tensor_parallel_size=args.tp, nnodes=args.nnodes, node_rank=args.node_rank,
                              master_addr=args.master_addr, master_port=args.master_port)
    speculative = speculative_config_from_flags(args.speculative_config, args.golden_al, args.thinking)
    return EngineConfig(model=model, cache=cache, scheduler=scheduler, device=args.device,
                        attention_backend=args.attention_backend, seed=args.seed, weights=args.weights,
                        parallel=parallel, speculative=speculative, step_delay_ms=args.step_delay_ms,
                        enforce_eager=args.enforce_eager,
                        cuda_graph_sizes=_int_list(args.cuda_graph_sizes, "--cuda-graph-sizes"))


def _int_list(text: str | None, flag: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); None -> ()."""
    if text is None:
        return ()
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
