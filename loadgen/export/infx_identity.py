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
- hw: the GPU key of what the run measured, never a guess: the names its levels' GPU telemetry
  read (`levels[i].gpu.gpus[].name`, "NVIDIA H100 80GB HBM3" -> h100) and the device the
  in-process engine names (`config.device_name`, also in its /v1/models entry). Without `--hw`,
  a measured GPU InferenceX has no key for, several kinds of GPU, a run our server served from
  CPU and a run that recorded no GPU's name are refused. `--hw` is the fallback, and overrides
  what was measured (telemetry on the client's host reads the client's GPUs) with a warning
  where they disagree; it may add a runner suffix (`h100-nv`); an hw InferenceX has no key for
  is warned about.
- the model prefix must resolve to a model InferenceX's ingest knows (its keys, aliases and
  precision suffixes: loadgen/schemas/infx_keys.json). Our server's served name is only a default:
  one that resolves to nothing is refused (every row would be dropped), an unknown
  `--model-prefix` warned about, as an unknown `--hw` is.
- our own server fills framework (`agentload`), precision (`bf16`) and the model prefix (its
  served model name); any other server needs --framework, --precision and --model-prefix.
- image and recipe_fingerprint: --image and --recipe-fingerprint, else what a recipe run recorded
  (its launch record, loadgen/recipe/provenance.py: the recipe's server.image and the curve's
  fingerprint), else empty.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from loadgen.recipe.provenance import LAUNCH_KEY

log = logging.getLogger(__name__)

AGENTIC_SCENARIO = "agentic-coding"  # InferenceX's name of the agentic scenario (configs and rows)
SPEC_METHODS = ("mtp", "draft_model", "none")  # InferenceX's spec-decoding vocabulary
KEYS_FILE = Path(__file__).resolve().parents[1] / "schemas" / "infx_keys.json"
_KEYS = orjson.loads(KEYS_FILE.read_bytes())
INFX_GPU_KEYS: tuple[str, ...] = tuple(_KEYS["gpu_keys"]["keys"])
INFX_MODEL_KEYS: tuple[str, ...] = tuple(_KEYS["model_keys"]["keys"])
PREFIX_ALIASES: dict[str, str] = _KEYS["model_prefix_aliases"]["aliases"]
PRECISION_SUFFIX = re.compile(_KEYS["model_prefix_precision_suffix"]["pattern"], re.IGNORECASE)
UNNAMED_GPU = "unknown"  # loadgen/telemetry/gpu.py's name for a GPU whose exporter gives none
OUR_FRAMEWORK = "agentload"
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


def resolve_identity(flags: IdentityFlags, doc: dict[str, Any], run_name: str) -> Identity:
    """The identity of one run (a results document) from the flags, its config and the GPUs it
    measured; ExportError names what is missing or contradicts the run."""
    config = doc["config"]
    server = config.get("server") or {}
    launch = doc.get(LAUNCH_KEY) or {}
    started = launch.get("server") or {}  # the image: a recipe run's record of what it started
    ours = bool(server.get("ours"))
    server_gpus = int(server.get("num_gpus") or 0)
    defaults = {"framework": OUR_FRAMEWORK, "precision": OUR_PRECISION, "model_prefix": config.get("model")} \
        if ours else {}
    chosen = {f.name: getattr(flags, f.name) for f in fields(flags)}
    for key, value in defaults.items():
        if chosen[key] is None:
            chosen[key] = value
    chosen["hw"] = _hardware(flags.hw, measured_gpu_names(doc), ours and not server_gpus, run_name)
    missing = [f"--{key.replace('_', '-')}" for key in ("hw", "framework", "precision", "model_prefix")
               if not chosen[key]]
    if missing:
        why = [] if ours else ["its server is not ours"]
        if not chosen["hw"]:
            why.append("the run recorded no GPU's name to take the hardware from; GPU telemetry: "
                       f"{config.get('gpu_telemetry') or 'not recorded'}")
        raise ExportError(f"run {run_name}: {', '.join(missing)} required ({'; '.join(why)})")
    _check_model_prefix(chosen["model_prefix"], flags.model_prefix is None, run_name)
    tp = chosen["tp"] or _default_tp(config, ours, server_gpus, flags, run_name)
    if tp % flags.dcp_size:
        raise ExportError(f"--dcp-size {flags.dcp_size} must divide the TP degree {tp} (run {run_name})")
    identity = Identity(
        hw=chosen["hw"], model=str(config.get("model") or chosen["model_prefix"]),
        infmax_model_prefix=chosen["model_prefix"], framework=chosen["framework"],
        precision=chosen["precision"], spec_decoding=chosen["spec_decoding"] or _spec_method(config),
        image=flags.image or started.get("image") or "",
        recipe_fingerprint=flags.recipe_fingerprint or launch.get("recipe_fingerprint") or "",
        tp=tp, ep=flags.ep, pp=flags.pp,
        dcp_size=flags.dcp_size, pcp_size=flags.pcp_size, dp_attention=flags.dp_attention,
    )
    _check_gpu_count(identity, config, ours, server_gpus, run_name)
    if gpu_key(identity.hw) is None:
        log.warning("--hw %s is not a GPU key InferenceX knows (%s): its ingest would skip these rows",
                    identity.hw, ", ".join(INFX_GPU_KEYS))
    return identity


def gpu_key(hw: str) -> str | None:
    """The GPU key InferenceX's ingest files an hw value under (normalizers.ts hwToGpuKey: lowercased, after
    the last ':', before the first '-'), or None when it knows none and skips the row."""
    base = hw.lower().split(":")[-1].split("-")[0]
    return base if base in INFX_GPU_KEYS else None


def model_key(prefix: str) -> str | None:
    """The model key InferenceX's ingest resolves a model prefix to (normalizers.ts resolvePrefixToKey: a
    key, an alias, then both again without a precision suffix such as `-fp8`), or None."""
    lower = prefix.lower()
    for candidate in (lower, PRECISION_SUFFIX.sub("", lower)):
        if candidate in INFX_MODEL_KEYS:
            return candidate
        if candidate in PREFIX_ALIASES:
            return PREFIX_ALIASES[candidate]
    return None


def measured_gpu_names(doc: dict[str, Any]) -> list[str]:
    """The names of the GPUs a run recorded: its levels' GPU telemetry and the device the in-process
    engine names (in the config and in its /v1/models entry)."""
    config = doc["config"]
    card = (config.get("server") or {}).get("models_entry") or {}
    names = {gpu.get("name") for level in doc["levels"] for gpu in (level.get("gpu") or {}).get("gpus", [])}
    names |= {config.get("device_name"), card.get("device_name")}
    return sorted(name for name in names if isinstance(name, str) and name and name != UNNAMED_GPU)


def gpu_key_of_name(name: str) -> str | None:
    """The GPU key a device name spells as one of its words ("NVIDIA H100 80GB HBM3" -> h100, "AMD
    Instinct MI355X" -> mi355x), or None ("NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB")."""
    return next((word for word in re.findall(r"[a-z0-9]+", name.lower()) if word in INFX_GPU_KEYS), None)


def _hardware(flag: str | None, names: list[str], on_cpu: bool, run_name: str) -> str | None:
    """The hw key of the GPU the run measured; --hw overrides it, warned about where they disagree (a
    telemetry that read another host's GPUs), and stands in where nothing was recorded; None when
    neither gives one."""
    keys = {name: gpu_key_of_name(name) for name in names}
    kinds = set(keys.values())
    measured = "CPU" if on_cpu else ", ".join(f"{name} -> {key or 'no InferenceX key'}" for name, key in keys.items())
    if flag is not None:
        if on_cpu or (keys and gpu_key(flag) not in kinds):
            log.warning("--hw %s is not what run %s measured (%s): its rows are filed under --hw as asked",
                        flag, run_name, measured)
        return flag
    if on_cpu:
        raise ExportError(f"run {run_name} served from CPU, which InferenceX has no hardware key for")
    if None in kinds:
        unknown = ", ".join(name for name, key in keys.items() if key is None)
        raise ExportError(f"run {run_name} measured {unknown}, a GPU InferenceX has no hardware key for "
                          f"({', '.join(INFX_GPU_KEYS)}): its ingest would skip the rows; pass --hw only if the "
                          "GPU telemetry read GPUs other than the server's")
    if len(kinds) > 1:
        raise ExportError(f"run {run_name} measured several kinds of GPU ({measured}); pass --hw naming the one "
                          "the server ran on")
    return kinds.pop() if kinds else None


def _check_model_prefix(prefix: str, defaulted: bool, run_name: str) -> None:
    """A prefix InferenceX's ingest resolves to no model gets every row dropped as an unmapped model."""
    if model_key(prefix) is not None:
        return
    known = ", ".join((*INFX_MODEL_KEYS, *PREFIX_ALIASES))
    if defaulted:
        raise ExportError(f"run {run_name}: the model prefix defaults to the served model's name {prefix!r}, "
                          "which InferenceX's ingest maps to no model, so it would drop every row; pass "
                          f"--model-prefix (one of {known}, optionally with a precision suffix such as -fp8)")
    log.warning("--model-prefix %s is no model InferenceX's ingest knows (%s, optionally with a precision "
                "suffix such as -fp8): it would skip these rows", prefix, known)


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
