"""`loadgen recipe from-infx CONFIG KEY`: one InferenceX benchmark-config entry as a recipe.

CONFIG is an InferenceX master config (`configs/*-master.yaml`: entry name -> image, model,
model-prefix, precision, framework, scenarios). KEY names the entry; its `agentic-coding`
scenario's search-space entry (--entry N when it has several) gives the topology (tp, ep, pp,
dcp-size, pcp-size, dp-attn), the concurrency list (`conc-list`, or `conc-start`..`conc-end`
doubling with the end always included, as InferenceX expands it) and `spec-decoding`.

The recipe (schema `agentload.recipe/1`, loadgen/recipe/schema.py; printed as YAML or written to
--out) runs that sweep against:
- `--server ours` (default): our server with `--tp` = the entry's TP degree and the `--model-preset`
  shape; it runs tensor parallelism only, so an entry with ep > 1, pp/pcp > 1, DP attention or
  KV offloading is refused;
- `--server vllm`: an external `vllm serve MODEL --port {port}` (or --command) given
  tensor_parallel_size, enable_expert_parallel when ep > 1, and the speculative config;
- `--server url --url URL`: a running server (its GPUs = tp x pp x pcp-size, for per-GPU numbers).

Speculative decoding (`spec-decoding: mtp`): InferenceX keeps the draft length in its launch
scripts, so --spec-k is required. The golden AL is selected as InferenceX does, by the entry's
model prefix (golden_al/curves.py; --golden-al overrides), in thinking mode --thinking (default
`on`, InferenceX's default), and checked here: a prefix, k or mode without a golden AL is an
error. Our server and vLLM run synthetic acceptance at that AL; every server's requests carry
the expected AL (workload.golden_al). The sweep window defaults to InferenceX's agentic duration
(3600 s); the trace set is ours (`agentic-coding`), not the entry's `trace-source`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loadgen.export.infx_identity import AGENTIC_SCENARIO
from loadgen.recipe.schema import SCHEMA, RecipeError, recipe_from_dict

SERVERS = ("ours", "vllm", "url")
CONC_STEP = 2  # InferenceX's conc-start..conc-end step factor


class InfxConfigError(ValueError):
    """An InferenceX config entry that cannot become a recipe; names the file, key and field."""


@dataclass(frozen=True)
class FromInfxOptions:
    server: str = "ours"
    url: str | None = None
    command: str | None = None  # vllm: the command line, {port} where the port goes
    entry: int | None = None  # search-space index (required when there are several)
    spec_k: int | None = None
    thinking: str = "on"  # InferenceX's default THINKING_MODE
    golden_al: str | None = None  # default: the entry's model prefix
    model_preset: str = "v32"  # ours: the engine preset that stands in for the entry's model
    duration_s: float = 3600.0  # InferenceX's default agentic duration


def read_entry(path: Path, key: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InfxConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise InfxConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise InfxConfigError(f"{path}: expected a mapping of entry names to configs")
    if key not in document:
        near = sorted(name for name in document if str(name).split("-")[0] == key.split("-")[0])[:8]
        hint = f"; entries of that model: {', '.join(near)}" if near else ""
        raise InfxConfigError(f"{path}: no entry {key!r}{hint}")
    entry = document[key]
    if not isinstance(entry, dict):
        raise InfxConfigError(f"{path}: {key}: expected a mapping")
    for field in ("model", "model-prefix", "precision", "framework", "scenarios"):
        if field not in entry:
            raise InfxConfigError(f"{path}: {key}.{field}: missing")
    return entry


def pick_search_space(entry: dict[str, Any], where: str, index: int | None) -> dict[str, Any]:
    scenarios = entry["scenarios"] or {}
    blocks = scenarios.get(AGENTIC_SCENARIO)
    if not blocks:
        raise InfxConfigError(f"{where}.scenarios: no {AGENTIC_SCENARIO} scenario (it has: {', '.join(scenarios)}); "
                              "agentload replays agentic traces")
    spaces = [space for block in blocks for space in block.get("search-space", [])]
    if index is None and len(spaces) > 1:
        listing = "; ".join(f"{i}: {_describe(space)}" for i, space in enumerate(spaces))
        raise InfxConfigError(f"--entry: {where} has {len(spaces)} search-space entries, choose one: {listing}")
    index = index or 0
    if not 0 <= index < len(spaces):
        raise InfxConfigError(f"--entry: {where} has search-space entries 0..{len(spaces) - 1}, got {index}")
    space = spaces[index]
    if "prefill" in space or "decode" in space:
        raise InfxConfigError(f"{where}.search-space[{index}]: disaggregated prefill/decode workers have no "
                              "recipe form")
    return space


def concurrencies(space: dict[str, Any], where: str) -> list[int]:
    if "conc-list" in space:
        return [int(c) for c in space["conc-list"]]
    start, end = space.get("conc-start"), space.get("conc-end")
    if not (isinstance(start, int) and isinstance(end, int) and 0 < start <= end):
        raise InfxConfigError(f"{where}: needs conc-list or conc-start <= conc-end, got {start!r}..{end!r}")
    values, conc = [], start
    while True:
        values.append(conc)
        if conc == end:
            return values
        conc = min(conc * CONC_STEP, end)


def recipe_dict(entry: dict[str, Any], key: str, options: FromInfxOptions, source: str = "config") -> dict[str, Any]:
    """The recipe, in the dict form of loadgen/recipe/schema.py."""
    where = f"{source}: {key}"
    space = pick_search_space(entry, where, options.entry)
    topology = {name: int(space.get(name, 1) or 1) for name in ("tp", "ep", "pp", "dcp-size", "pcp-size")}
    dp_attn = bool(space.get("dp-attn", False))
    speculative = _speculative(entry, space, options, where)
    server = _server(entry, space, topology, dp_attn, speculative, options, where)
    workload: dict[str, Any] = {"traces": "agentic-coding"}
    if speculative:
        workload.update(golden_al=speculative["golden_al"], spec_k=speculative["k"], thinking=options.thinking)
    return {
        "schema": SCHEMA,
        "name": key,
        "description": (f"From InferenceX {key}: {entry['model']} ({entry['model-prefix']}), {entry['precision']}, "
                        f"{entry['framework']}, {_describe(space)}"
                        + (f", golden AL {speculative['al']:g} at k={speculative['k']} thinking {options.thinking}"
                           if speculative else "")),
        "server": server,
        "workload": workload,
        "sweep": {"conc": concurrencies(space, where), "duration_s": options.duration_s},
        "variants": [{"name": _variant_name(topology, dp_attn)}],
    }


def _speculative(entry: dict[str, Any], space: dict[str, Any], options: FromInfxOptions,
                 where: str) -> dict[str, Any] | None:
    from golden_al.curves import CurveError, load_curve

    method = space.get("spec-decoding", "none")
    if method == "none":
        if options.spec_k is not None:
            raise InfxConfigError(f"--spec-k: {where} has no speculative decoding")
        return None
    if options.spec_k is None or options.spec_k < 1:
        raise InfxConfigError(f"--spec-k: {where} speculates ({method}); InferenceX keeps the draft length in its "
                              "launch scripts, so give it")
    ref = options.golden_al or str(entry["model-prefix"])
    try:
        curve = load_curve(ref)
        al = curve.al(options.spec_k, options.thinking == "on")
    except CurveError as exc:
        raise InfxConfigError(f"--golden-al: {exc}") from None
    draft = "dspark" if curve.method.lower().startswith("dspark") else "mtp"
    return {"method": method, "draft": draft, "k": options.spec_k, "al": al, "golden_al": ref}


def _server(entry: dict[str, Any], space: dict[str, Any], topology: dict[str, int], dp_attn: bool,
            speculative: dict[str, Any] | None, options: FromInfxOptions, where: str) -> dict[str, Any]:
    gpus = topology["tp"] * topology["pp"] * topology["pcp-size"]
    if options.server == "url":
        if not options.url:
            raise InfxConfigError("--url: required with --server url")
        return {"kind": "url", "url": options.url, "gpus": gpus}
    if options.server == "ours":
        unsupported = [f"{name} {value}" for name, value in topology.items() if name != "tp" and value > 1]
        unsupported += ["dp-attn"] if dp_attn else []
        offload = space.get("kv-offloading", "none")
        unsupported += [f"kv-offloading {offload}"] if offload != "none" else []
        if unsupported:
            raise InfxConfigError(f"{where}: our server runs tensor parallelism only, not {', '.join(unsupported)}; "
                                  "use --server vllm or --server url")
        flags: dict[str, Any] = {"model": options.model_preset, "tp": topology["tp"]}
        if speculative:
            flags.update(speculative_config={"method": speculative["draft"], "num_speculative_tokens": speculative["k"],
                                             "rejection_sample_method": "synthetic"},
                         golden_al=speculative["golden_al"], thinking=options.thinking)
        return {"kind": "ours", "flags": flags}
    if dp_attn or topology["pp"] > 1 or topology["pcp-size"] > 1 or topology["dcp-size"] > 1:
        raise InfxConfigError(f"{where}: only tp and ep map to vLLM flags here ({_describe(space)}); "
                              "write the server command yourself and use --server url")
    flags = {"tensor_parallel_size": topology["tp"]}
    if topology["ep"] > 1:
        flags["enable_expert_parallel"] = True
    if speculative:
        flags["speculative_config"] = {"method": speculative["method"], "num_speculative_tokens": speculative["k"],
                                       "rejection_sample_method": "synthetic",
                                       "synthetic_acceptance_length": speculative["al"]}
    command = options.command or f"vllm serve {entry['model']} --port {{port}}"
    return {"kind": "command", "command": command, "flags": flags, "gpus": gpus}


def _describe(space: dict[str, Any]) -> str:
    parts = [f"{name} {space[name]}" for name in ("tp", "ep", "pp", "dcp-size", "pcp-size") if name in space]
    parts += ["dp-attn"] if space.get("dp-attn") else []
    parts += [f"kv-offloading {space['kv-offloading']}"] if "kv-offloading" in space else []
    parts += [f"spec {space['spec-decoding']}"] if "spec-decoding" in space else []
    conc = space.get("conc-list") or f"{space.get('conc-start')}..{space.get('conc-end')}"
    return ", ".join(parts + [f"conc {conc}"])


def _variant_name(topology: dict[str, int], dp_attn: bool) -> str:
    name = f"tp{topology['tp']}" + (f"-ep{topology['ep']}" if topology["ep"] > 1 else "")
    return name + ("-dpattn" if dp_attn else "")


def to_yaml(recipe: dict[str, Any]) -> str:
    """YAML in the recipe schema's form: flags that are mappings stay mappings."""
    return yaml.safe_dump(recipe, sort_keys=False, default_flow_style=None)


# ---- command line ---------------------------------------------------------------------------

_DEFAULTS = FromInfxOptions()


def register_from_infx(actions: argparse._SubParsersAction) -> None:
    """Add `from-infx` to `loadgen recipe`'s actions."""
    p = actions.add_parser(
        "from-infx", help="a recipe from one InferenceX benchmark-config entry",
        description="Turn one entry of an InferenceX master config (model prefix, TP/EP, concurrency "
        "list, speculative decoding) into a recipe for our server, a vLLM command or a URL. The golden AL "
        "comes from the entry's model prefix at --spec-k, as InferenceX selects it.")
    p.add_argument("config", metavar="CONFIG", help="InferenceX master config YAML (configs/*-master.yaml)")
    p.add_argument("key", metavar="KEY", help="entry name, e.g. dsv4-fp4-mi355x-vllm-agentic-mtp")
    p.add_argument("--entry", type=int, default=_DEFAULTS.entry, metavar="N",
                   help="search-space entry index (required when the scenario has several)")
    p.add_argument("--server", choices=SERVERS, default=_DEFAULTS.server,
                   help=f"what serves it (default: {_DEFAULTS.server})")
    p.add_argument("--url", default=_DEFAULTS.url, help="--server url: base URL of the running server")
    # dest server_command: `command` is the top-level parser's (`loadgen COMMAND`), which errors name
    p.add_argument("--command", dest="server_command", default=_DEFAULTS.command,
                   help="--server vllm: command line with {port} (default: vllm serve MODEL --port {port})")
    p.add_argument("--spec-k", type=int, default=_DEFAULTS.spec_k, metavar="K",
                   help="num_speculative_tokens (required when the entry speculates)")
    p.add_argument("--thinking", choices=("on", "off"), default=_DEFAULTS.thinking,
                   help=f"golden AL thinking mode (default: {_DEFAULTS.thinking}, as InferenceX)")
    p.add_argument("--golden-al", default=_DEFAULTS.golden_al, metavar="REF",
                   help="golden AL curve (default: the entry's model prefix)")
    p.add_argument("--model-preset", default=_DEFAULTS.model_preset,
                   help=f"--server ours: engine preset standing in for the model (default: {_DEFAULTS.model_preset})")
    p.add_argument("--duration", type=float, default=_DEFAULTS.duration_s, metavar="S",
                   help=f"measurement window per level, s (default: {_DEFAULTS.duration_s:g}, InferenceX's)")
    p.add_argument("--out", metavar="FILE", help="write the recipe here (default: print it)")
    p.set_defaults(func=run_from_infx)


def run_from_infx(args: argparse.Namespace) -> int:
    from loadgen.errors import UsageError

    options = FromInfxOptions(server=args.server, url=args.url, command=args.server_command, entry=args.entry,
                              spec_k=args.spec_k, thinking=args.thinking, golden_al=args.golden_al,
                              model_preset=args.model_preset, duration_s=args.duration)
    path = Path(args.config)
    try:
        recipe = recipe_dict(read_entry(path, args.key), args.key, options, str(path))
        recipe_from_dict(recipe, f"the recipe made from {path}")  # what it writes, `recipe check` accepts
        text = to_yaml(recipe)
    except (InfxConfigError, RecipeError) as exc:
        raise UsageError(str(exc)) from None
    header = f"# generated by `loadgen recipe from-infx {path.name} {args.key}`\n"
    if args.out:
        Path(args.out).write_text(header + text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(header + text, end="")
    return 0
