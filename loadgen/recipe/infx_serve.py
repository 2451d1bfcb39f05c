"""The server section of a recipe made by `recipe from-infx`: one InferenceX search-space entry's
topology, KV offloading and draft head as flags of our server, of a vLLM or SGLang command line, or
a running server's URL; what cannot run that way is refused with the reason.

The flags follow InferenceX's single-node launch scripts (benchmarks/single_node/agentic/*.sh,
commit 843c625):
- vLLM (`vllm serve MODEL`): tensor_parallel_size = tp; DP attention (DEP) is tensor_parallel_size 1
  with data_parallel_size = tp; ep > 1 adds enable_expert_parallel. DRAM offload through its
  vllm-simple backend is kv_transfer_config with the SimpleCPUOffloadConnector, cpu_bytes_to_use the
  budget shared over the GPUs, lazy offload unless DP attention runs. Acceptance is synthetic:
  speculative_config's rejection_sample_method synthetic at synthetic_acceptance_length = the AL.
- SGLang (`python -m sglang.launch_server --model-path MODEL`): tp; DP attention adds dp = tp and
  enable_dp_attention; ep > 1 adds ep_size. DRAM offload through HiCache: enable_hierarchical_cache
  with hicache_size = the budget per TP rank (a first size: some models' scripts keep room for
  their draft or Mamba pools, or give DSv4 a ratio instead), the kernel I/O backend, the page-first
  layout and selective write-through. Drafts: speculative_algorithm EAGLE (EAGLE3 for a separate
  EAGLE3 head), k steps of top-1, k + 1 draft tokens; acceptance is simulated through the server's
  environment: SGLANG_SIMULATE_ACC_LEN = the AL, match-expected, real draft tokens.
- The DRAM budget is InferenceX's sweep generator's (loadgen/schemas/infx_nodes.json): its node's
  available DRAM (capped) x the scenario's dram-utilization x the entry's GPUs / the node's GPUs,
  in whole GB; --offload-gb gives another.
- Our server runs tensor parallelism only, so ep, pp, pcp, dcp, DP attention and offloading are
  refused for it; for vLLM and SGLang pp, pcp and dcp have no mapping here, Mooncake and LMCache
  need a service beside the server that a recipe does not start, and a multi-node entry needs
  its own launcher: each is refused with a pointer to --server url.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from golden_al.pins import THINKING
from loadgen.export.infx_identity import KEYS_FILE
from loadgen.run.validity import SUBMISSION

SERVERS = ("ours", "vllm", "sglang", "url")
NODES_FILE = KEYS_FILE.with_name("infx_nodes.json")
GB = 1_000_000_000
MIB = 1 << 20
HICACHE_FLAGS = {"hicache_io_backend": "kernel", "hicache_mem_layout": "page_first",
                 "hicache_write_policy": "write_through_selective"}
SIMULATED_ACCEPTANCE = {"SGLANG_SIMULATE_ACC_METHOD": "match-expected",
                        "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}


class InfxConfigError(ValueError):
    """An InferenceX config entry that cannot become a recipe; names the file, key and field."""


@dataclass(frozen=True)
class FromInfxOptions:
    server: str = "ours"
    url: str | None = None
    command: str | None = None  # vllm/sglang: the command line, {port} where the port goes
    entry: int | None = None  # search-space index (None: the only one; the CLI makes one recipe per entry)
    scenario: str | None = None  # default: agentic-coding when the entry has it, else fixed-seq-len
    spec_k: int | None = None  # default: the draft length InferenceX's launch script runs
    thinking: str = THINKING  # InferenceX's default THINKING_MODE
    golden_al: str | None = None  # default: the entry's model prefix
    model_preset: str = "v32"  # ours: the engine preset that stands in for the entry's model
    duration_s: float = SUBMISSION.duration_s  # InferenceX's default agentic duration
    offload_gb: int | None = None  # default: InferenceX's DRAM budget for the entry's node


@dataclass(frozen=True)
class Topology:
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dcp: int = 1
    pcp: int = 1
    dp_attn: bool = False

    @classmethod
    def of(cls, space: dict[str, Any]) -> Topology:
        sizes = {name: int(space.get(key, 1) or 1) for name, key in
                 (("tp", "tp"), ("ep", "ep"), ("pp", "pp"), ("dcp", "dcp-size"), ("pcp", "pcp-size"))}
        return cls(**sizes, dp_attn=bool(space.get("dp-attn", False)))

    @property
    def gpus(self) -> int:
        """InferenceX's single-node GPU count: EP, DP attention and DCP share the TP GPUs."""
        return self.tp * self.pp * self.pcp

    def beyond_tp(self) -> list[str]:
        """Every part of the topology that is not tensor parallelism, e.g. ['ep 8', 'dp-attn']."""
        parts = [f"{name} {getattr(self, name)}" for name in ("ep", "pp", "dcp", "pcp") if getattr(self, name) > 1]
        return parts + (["dp-attn"] if self.dp_attn else [])


@dataclass(frozen=True)
class Draft:
    """The speculative decoding a recipe asks for: k drafts accepted at the golden AL."""

    k: int
    al: float
    golden_al: str  # the curve reference (the model prefix unless --golden-al)
    curve_method: str | None  # the curve's own name of its draft method (MTP, EAGLE3, DSpark)
    head_method: str | None  # vLLM's method name of the draft head (mtp, eagle3, dspark); None: unknown here
    head_model: str | None  # the draft model a separate head needs


@dataclass(frozen=True)
class Offload:
    backend: str  # InferenceX's kv-offload-backend name (hicache, vllm-simple, mooncake, ...)
    budget_gb: int


def offload_of(entry: dict[str, Any], block: dict[str, Any], space: dict[str, Any], topology: Topology,
               given_gb: int | None, where: str) -> Offload | None:
    """The entry's KV offloading and its DRAM budget; None when it keeps the KV cache on the GPUs."""
    if space.get("kv-offloading", "none") == "none":
        return None
    backend = str((space.get("kv-offload-backend") or {}).get("name", "none"))
    if given_gb is not None:
        return Offload(backend, given_gb)
    nodes = orjson.loads(NODES_FILE.read_bytes())
    node = nodes["nodes"]["by_runner"].get(entry.get("runner"))
    if node is None or "dram-utilization" not in block:
        raise InfxConfigError(f"--offload-gb: {where} offloads KV to DRAM, and InferenceX's budget for it is not "
                              f"known here (runner {entry.get('runner')!r}, dram-utilization "
                              f"{block.get('dram-utilization')!r}); give the budget in GB")
    available = min(node["available_cpu_dram_mib"], nodes["offload_budget"]["available_cpu_dram_cap_mib"])
    # in decimal arithmetic, as upstream computes it: a float product can fall on either side of a whole GB
    budget = Decimal(available) * MIB * Decimal(str(block["dram-utilization"])) * topology.gpus / node["gpus_per_node"]
    return Offload(backend, int(budget / GB))


def server_section(entry: dict[str, Any], block: dict[str, Any], space: dict[str, Any], draft: Draft | None,
                   options: FromInfxOptions, where: str) -> dict[str, Any]:
    """The recipe's `server` mapping for --server ours|vllm|sglang|url."""
    topology = Topology.of(space)
    if options.server == "url":
        if not options.url:
            raise InfxConfigError("--url: required with --server url")
        return {"kind": "url", "url": options.url, "gpus": topology.gpus}
    if draft is not None and draft.head_method is None:
        raise InfxConfigError(f"{where}: the {draft.curve_method} draft head of {entry['model-prefix']} is named in no "
                              "InferenceX launch script known here (golden_al/infx_pins.yaml heads); start the server "
                              "yourself and use --server url")
    if entry.get("multinode"):
        raise InfxConfigError(f"{where}: a multi-node entry needs its own launcher; start it yourself and use "
                              "--server url")
    if options.server == "ours":
        offloading = space.get("kv-offloading", "none")
        return _ours(topology, None if offloading == "none" else str(offloading), draft, options, where)
    offload = offload_of(entry, block, space, topology, options.offload_gb, where)
    if topology.pp > 1 or topology.pcp > 1 or topology.dcp > 1:
        raise InfxConfigError(f"{where}: only tp, ep and DP attention map to {options.server} flags here, not "
                              f"{', '.join(topology.beyond_tp())}; write the server command yourself and use "
                              "--server url")
    if offload is not None and offload.backend not in ("vllm-simple", "hicache"):
        raise InfxConfigError(f"{where}: KV offloading through {offload.backend} needs a service beside the server "
                              "that a recipe does not start; start both yourself and use --server url")
    build = _vllm if options.server == "vllm" else _sglang
    return build(entry, topology, offload, draft, options, where)


def _ours(topology: Topology, offloading: str | None, draft: Draft | None, options: FromInfxOptions,
          where: str) -> dict[str, Any]:
    unsupported = topology.beyond_tp() + ([f"kv-offloading {offloading}"] if offloading else [])
    if unsupported:
        raise InfxConfigError(f"{where}: our server runs tensor parallelism only, not {', '.join(unsupported)}; "
                              "use --server vllm, sglang or url")
    flags: dict[str, Any] = {"model": options.model_preset, "tp": topology.tp}
    if draft:
        method = "dspark" if draft.head_method == "dspark" else "mtp"  # our one draft-head mechanism, by name
        flags.update(speculative_config={"method": method, "num_speculative_tokens": draft.k,
                                         "rejection_sample_method": "synthetic"},
                     golden_al=draft.golden_al, thinking=options.thinking)
    return {"kind": "ours", "flags": flags}


def _vllm(entry: dict[str, Any], topology: Topology, offload: Offload | None, draft: Draft | None,
          options: FromInfxOptions, where: str) -> dict[str, Any]:
    flags: dict[str, Any] = {"tensor_parallel_size": 1 if topology.dp_attn else topology.tp}
    if topology.dp_attn:
        flags["data_parallel_size"] = topology.tp
    if topology.ep > 1:
        flags["enable_expert_parallel"] = True
    if offload is not None:
        if offload.backend != "vllm-simple":
            raise InfxConfigError(f"{where}: vLLM offloads to DRAM through vllm-simple here, not {offload.backend}")
        flags["kv_transfer_config"] = {
            "kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": offload.budget_gb * GB // topology.gpus,
                                          "lazy_offload": not topology.dp_attn}}
    if draft:
        head = {"method": draft.head_method, **({"model": draft.head_model} if draft.head_model else {})}
        flags["speculative_config"] = {**head, "num_speculative_tokens": draft.k,
                                       "rejection_sample_method": "synthetic", "synthetic_acceptance_length": draft.al}
    command = options.command or f"vllm serve {entry['model']} --port {{port}}"
    return _command(entry, command, flags, {}, topology)


def _sglang(entry: dict[str, Any], topology: Topology, offload: Offload | None, draft: Draft | None,
            options: FromInfxOptions, where: str) -> dict[str, Any]:
    flags: dict[str, Any] = {"tp": topology.tp}
    if topology.dp_attn:
        flags.update(dp=topology.tp, enable_dp_attention=True)
    if topology.ep > 1:
        flags["ep_size"] = topology.ep
    if offload is not None:
        if offload.backend != "hicache":
            raise InfxConfigError(f"{where}: SGLang offloads to DRAM through hicache here, not {offload.backend}")
        flags.update(enable_hierarchical_cache=True, hicache_size=offload.budget_gb // topology.tp, **HICACHE_FLAGS)
    env: dict[str, Any] = {}
    if draft:
        if draft.head_method == "dspark":
            raise InfxConfigError(f"{where}: SGLang has no DSpark drafts in InferenceX's scripts; use --server vllm")
        flags["speculative_algorithm"] = "EAGLE3" if draft.head_method == "eagle3" else "EAGLE"
        if draft.head_model:
            flags["speculative_draft_model_path"] = draft.head_model
        flags.update(speculative_num_steps=draft.k, speculative_eagle_topk=1, speculative_num_draft_tokens=draft.k + 1)
        env = {"SGLANG_SIMULATE_ACC_LEN": f"{draft.al:g}", **SIMULATED_ACCEPTANCE}
    command = options.command or f"python -m sglang.launch_server --model-path {entry['model']} --port {{port}}"
    return _command(entry, command, flags, env, topology)


def _command(entry: dict[str, Any], command: str, flags: dict[str, Any], env: dict[str, Any],
             topology: Topology) -> dict[str, Any]:
    section = {"kind": "command", "command": command, "flags": flags, "gpus": topology.gpus}
    if env:
        section["env"] = env
    if entry.get("image"):
        section["image"] = str(entry["image"])
    return section
