"""Who measured what, in InferenceX's vocabulary: the identity and topology keys of an export row.

InferenceX's ingest keys every row by hardware, model prefix, framework, precision, speculative
method, disaggregation and topology; a row without them is dropped. These keys are not in a
results file (it records what the client saw), so they come from `loadgen report` flags, with
defaults filled from the run's config where the run knows them:

- tp: the tensor-parallel DEGREE. Our server runs tensor parallelism only, so its `num_gpus`
  is its TP degree; for any other server the run's `gpus` divided by pp * pcp_size.
- GPUs per row: tp * pp * pcp_size, InferenceX's single-node count (EP and DP attention share
  the TP GPUs, decode context parallelism reuses them too). Per-GPU throughput divides by it.
- spec_decoding: our server's /v1/models card names its method; both of ours (MTP and DSpark,
  one draft head on the target's hidden state) are filed as `mtp`, the value InferenceX's
  configs use for DSpark arms too; a run that expected a golden AL (--golden-al) is `mtp` as
  well. Otherwise `none`.
- our own server fills hw (`h200` when it served from GPUs), framework (`agentload`),
  precision (`bf16`) and the model prefix (its served model name); any other server needs
  --hw, --framework, --precision and --model-prefix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

log = logging.getLogger(__name__)

AGENTIC_SCENARIO = "agentic-coding"  # InferenceX's name of the agentic scenario (configs and rows)
SPEC_METHODS = ("mtp", "draft_model", "none")  # InferenceX's spec-decoding vocabulary
# The GPU keys InferenceX's app maps a runner name to (the part before the first '-'); rows with
# any other hardware are skipped at its ingest.
INFX_GPU_KEYS = ("h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x")
OUR_FRAMEWORK = "agentload"
OUR_GPU = "h200"  # the GPU our server's kernels target; override with --hw
OUR_PRECISION = "bf16"


class ExportError(ValueError):
    """A run that cannot become an InferenceX row as asked; the message names the flag or run."""


@dataclass(frozen=True)
class IdentityFlags:
    """`loadgen report`'s identity flags; None means "fill from the run"."""

    hw: str | None = None
    framework: str | None = None
    precision: str | None = None
    model_prefix: str | None = None
    image: str = ""
    spec_decoding: str | None = None
    tp: int | None = None
    ep: int = 1
    pp: int = 1
    dcp_size: int = 1
    pcp_size: int = 1
    dp_attention: bool = False
    isl: int | None = None
    osl: int | None = None
    recipe_fingerprint: str = ""


@dataclass(frozen=True)
class Identity:
    """Every identity and topology key of one run's rows, resolved."""

    hw: str
    model: str
    infmax_model_prefix: str
    framework: str
    precision: str
    spec_decoding: str
    image: str
    recipe_fingerprint: str
    tp: int
    ep: int
    pp: int
    dcp_size: int
    pcp_size: int
    dp_attention: bool

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.pcp_size

    def keys(self) -> dict[str, Any]:
        """The row keys, typed as InferenceX's aggregators write them (dp_attention a string)."""
        return {
            "hw": self.hw, "image": self.image, "model": self.model,
            "infmax_model_prefix": self.infmax_model_prefix, "framework": self.framework,
            "precision": self.precision, "spec_decoding": self.spec_decoding, "disagg": False,
            "recipe_fingerprint": self.recipe_fingerprint, "is_multinode": False,
            "tp": self.tp, "pp": self.pp, "dcp_size": self.dcp_size, "pcp_size": self.pcp_size,
            "ep": self.ep, "dp_attention": "true" if self.dp_attention else "false",
        }


def resolve_identity(flags: IdentityFlags, config: dict[str, Any], run_name: str) -> Identity:
    """The identity of one run from the flags and its config; ExportError names what is missing."""
    server = config.get("server") or {}
    ours = bool(server.get("ours"))
    server_gpus = int(server.get("num_gpus") or 0)
    defaults = {"hw": OUR_GPU if server_gpus else None, "framework": OUR_FRAMEWORK,
                "precision": OUR_PRECISION, "model_prefix": config.get("model")} if ours else {}
    chosen = {f.name: getattr(flags, f.name) for f in fields(flags)}
    for key, value in defaults.items():
        if chosen[key] is None:
            chosen[key] = value
    missing = [f"--{key.replace('_', '-')}" for key in ("hw", "framework", "precision", "model_prefix")
               if not chosen[key]]
    if missing:
        why = "it served from CPU, which InferenceX has no hardware key for" if ours else "its server is not ours"
        raise ExportError(f"run {run_name}: {', '.join(missing)} required ({why})")
    tp = chosen["tp"] or _default_tp(config, ours, server_gpus, flags, run_name)
    if tp % flags.dcp_size:
        raise ExportError(f"--dcp-size {flags.dcp_size} must divide the TP degree {tp} (run {run_name})")
    identity = Identity(
        hw=chosen["hw"], model=str(config.get("model") or chosen["model_prefix"]),
        infmax_model_prefix=chosen["model_prefix"], framework=chosen["framework"],
        precision=chosen["precision"], spec_decoding=chosen["spec_decoding"] or _spec_method(config),
        image=flags.image, recipe_fingerprint=flags.recipe_fingerprint, tp=tp, ep=flags.ep, pp=flags.pp,
        dcp_size=flags.dcp_size, pcp_size=flags.pcp_size, dp_attention=flags.dp_attention,
    )
    _check_gpu_count(identity, config, ours, server_gpus, run_name)
    if identity.hw.lower().split("-")[0] not in INFX_GPU_KEYS:
        log.warning("--hw %s is not a GPU key InferenceX knows (%s): its ingest would skip these rows",
                    identity.hw, ", ".join(INFX_GPU_KEYS))
    return identity


def _default_tp(config: dict[str, Any], ours: bool, server_gpus: int, flags: IdentityFlags, run_name: str) -> int:
    if ours:
        return max(1, server_gpus)  # our server: TP only, one device per rank
    gpus = int(config.get("gpus") or 1)
    per_tp = flags.pp * flags.pcp_size
    if gpus % per_tp:
        raise ExportError(f"run {run_name}: its {gpus} GPUs are not a multiple of --pp x --pcp-size = {per_tp}; "
                          "pass --tp")
    return gpus // per_tp


def _check_gpu_count(identity: Identity, config: dict[str, Any], ours: bool, server_gpus: int,
                     run_name: str) -> None:
    """The topology must use the GPUs the run measured with: per-GPU throughput divides by them."""
    if ours and server_gpus and identity.gpus != server_gpus:
        raise ExportError(f"run {run_name}: --tp x --pp x --pcp-size = {identity.gpus} GPUs, but our server "
                          f"ran on {server_gpus}")
    gpus = int(config.get("gpus") or 1)
    if not ours and identity.gpus != gpus:
        log.warning("run %s was measured as %d GPU(s); the rows count tp x pp x pcp_size = %d",
                    run_name, gpus, identity.gpus)


def _spec_method(config: dict[str, Any]) -> str:
    """`mtp` when the server's card says it speculates or the run expected an AL, else `none`."""
    card = ((config.get("server") or {}).get("models_entry") or {}).get("speculative")
    speculates = isinstance(card, dict) and card.get("method") or config.get("spec_decode")
    return "mtp" if speculates else "none"
