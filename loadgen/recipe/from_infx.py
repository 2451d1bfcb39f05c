"""`loadgen recipe from-infx CONFIG KEY`: one InferenceX benchmark-config entry as a recipe.

CONFIG is an InferenceX master config (`configs/*-master.yaml`: entry name -> image, model,
model-prefix, precision, runner, framework, scenarios). KEY names the entry; its `agentic-coding`
scenario (or `fixed-seq-len`: --scenario, or the only one it has) gives the search-space entries
(--entry N when there are several): the topology (tp, ep, pp, dcp-size, pcp-size, dp-attn), KV
offloading, the concurrency list (`conc-list`, or `conc-start`..`conc-end` doubling with the end
always included, as InferenceX expands it) and `spec-decoding`.

The recipe (schema `agentload.recipe/1`, loadgen/recipe/schema.py; printed as YAML or written to
--out) runs that sweep against our server (`--server ours`, default: tensor parallelism with the
`--model-preset` shape), a vLLM or SGLang command line, or a running server (`--server url`);
loadgen/recipe/infx_serve.py maps the topology, offloading and draft head, and says what each
cannot run.

Speculative decoding (`spec-decoding: mtp`): the draft length is the one InferenceX's launch
script for the entry runs (golden_al/infx_pins.yaml, matched by model prefix, precision, the
runner's GPU and framework; a script that picks it by concurrency gives it only when the search
space's concurrencies share one); --spec-k chooses another, and is needed where no script is
known. The golden AL is selected as InferenceX does, by the entry's model prefix
(golden_al/curves.py; --golden-al overrides), in thinking mode --thinking (default `on`,
InferenceX's), and checked here: a prefix, k or mode without a golden AL is an error. Every server
accepts drafts synthetically at that AL; every request carries it (workload.golden_al).

Agentic sweeps default to InferenceX's agentic duration (3600 s) on our trace set
(`agentic-coding`, not the entry's `trace-source`). A fixed-seq-len space replays InferenceX's
random-length requests from a trace file written beside --out (loadgen/recipe/infx_fixed.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from golden_al.pins import THINKING_MODES
from loadgen.export.infx_identity import AGENTIC_SCENARIO, gpu_key
from loadgen.recipe.infx_serve import (
    SERVERS,
    Draft,
    FromInfxOptions,
    InfxConfigError,
    Topology,
    server_section,
)
from loadgen.recipe.schema import SCHEMA, RecipeError, recipe_from_dict

FIXED_SCENARIO = "fixed-seq-len"
SCENARIOS = (AGENTIC_SCENARIO, FIXED_SCENARIO)
CONC_STEP = 2  # InferenceX's conc-start..conc-end step factor


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


def search_spaces(entry: dict[str, Any], where: str,
                  scenario: str | None = None) -> tuple[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """(scenario, its (block, search-space entry) pairs in the config's order)."""
    scenarios = entry["scenarios"] or {}
    known = [name for name in SCENARIOS if scenarios.get(name)]
    if scenario is None:
        scenario = AGENTIC_SCENARIO if AGENTIC_SCENARIO in known else (known[0] if known else None)
    if scenario not in known:
        raise InfxConfigError(f"{where}.scenarios: no {scenario or ' or '.join(SCENARIOS)} scenario (it has: "
                              f"{', '.join(scenarios)})")
    return scenario, [(block, space) for block in scenarios[scenario] for space in block.get("search-space", [])]


def pick_search_space(entry: dict[str, Any], where: str, index: int | None,
                      scenario: str | None = None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(scenario, its block, the chosen search-space entry)."""
    scenario, spaces = search_spaces(entry, where, scenario)
    if index is None and len(spaces) > 1:
        listing = "; ".join(f"{i}: {_describe(space, block)}" for i, (block, space) in enumerate(spaces))
        raise InfxConfigError(f"--entry: {where} has {len(spaces)} search-space entries, choose one: {listing}")
    index = index or 0
    if not 0 <= index < len(spaces):
        raise InfxConfigError(f"--entry: {where} has search-space entries 0..{len(spaces) - 1}, got {index}")
    block, space = spaces[index]
    if "prefill" in space or "decode" in space:
        raise InfxConfigError(f"{where}.search-space[{index}]: disaggregated prefill/decode workers have no "
                              "recipe form")
    return scenario, block, space


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


def recipe_dict(entry: dict[str, Any], key: str, options: FromInfxOptions, source: str = "config",
                out: Path | None = None) -> dict[str, Any]:
    """The recipe, in the dict form of loadgen/recipe/schema.py; a fixed-seq-len space writes its trace
    file beside `out` (the recipe file)."""
    where = f"{source}: {key}"
    scenario, block, space = pick_search_space(entry, where, options.entry, options.scenario)
    topology, conc = Topology.of(space), concurrencies(space, where)
    draft = resolve_draft(entry, space, conc, options, where)
    workload: dict[str, Any] = {"traces": "agentic-coding"}
    if scenario == FIXED_SCENARIO:
        workload["traces"] = str(_fixed_trace(block, key, max(conc), out, where))
    if draft:
        workload.update(golden_al=draft.golden_al, spec_k=draft.k, thinking=options.thinking)
    description = (f"From InferenceX {key}: {entry['model']} ({entry['model-prefix']}), {entry['precision']}, "
                   f"{entry['framework']}, {_describe(space, block)}")
    if draft:
        description += f", golden AL {draft.al:g} at k={draft.k} thinking {options.thinking}"
    if scenario == FIXED_SCENARIO:
        description += f"; export with `loadgen report --format infx --isl {block['isl']} --osl {block['osl']}`"
    return {
        "schema": SCHEMA,
        "name": key,
        "description": description,
        "server": server_section(entry, block, space, draft, options, where),
        "workload": workload,
        "sweep": {"conc": conc, "duration_s": options.duration_s},
        "variants": [{"name": _variant_name(topology)}],
    }


def resolve_draft(entry: dict[str, Any], space: dict[str, Any], conc: list[int], options: FromInfxOptions,
                  where: str) -> Draft | None:
    """k (--spec-k, else the launch script's), the golden AL at k, and the family's draft head: the one
    the launch scripts name, else MTP's for an MTP curve, else None (only a running server, --server url,
    can serve that curve; `server_section` refuses the others once the server is chosen)."""
    from golden_al.curves import CurveError, load_curve
    from golden_al.pins import head

    method = space.get("spec-decoding", "none")
    if method == "none":
        if options.spec_k is not None:
            raise InfxConfigError(f"--spec-k: {where} has no speculative decoding")
        return None
    k = options.spec_k if options.spec_k is not None else _pinned_k(entry, conc, where)
    if k < 1:
        raise InfxConfigError(f"--spec-k: must be >= 1, got {k}")
    prefix = str(entry["model-prefix"])
    ref = options.golden_al or prefix
    try:
        curve = load_curve(ref)
        al = curve.al(k, options.thinking == "on")
    except CurveError as exc:
        raise InfxConfigError(f"--golden-al: {exc}") from None
    known = head(prefix)
    if known is not None:
        return Draft(k, al, ref, curve.method, known.method, known.model)
    mtp = not curve.method or curve.method.upper().startswith("MTP")
    return Draft(k, al, ref, curve.method, "mtp" if mtp else None, None)


def _pinned_k(entry: dict[str, Any], conc: list[int], where: str) -> int:
    from golden_al.pins import find_pin

    runner = str(entry.get("runner", ""))
    keys = (str(entry["model-prefix"]), str(entry["precision"]), gpu_key(runner) or runner, str(entry["framework"]))
    pin = find_pin(*keys)
    if pin is None:
        raise InfxConfigError(f"--spec-k: {where} speculates; InferenceX keeps the draft length in its launch "
                              f"scripts, and none known here (golden_al/infx_pins.yaml) runs {' '.join(keys)}: give it")
    bands = {pin.draft(c) for c in conc}
    if len(bands) != 1 or None in bands:
        raise InfxConfigError(f"--spec-k: InferenceX's {pin.script}.sh picks the draft length by concurrency "
                              f"({pin.describe()}), and this search space's concurrencies {conc} span more than one: "
                              "give --spec-k, and keep in the recipe's sweep.conc the concurrencies it is "
                              "run at")
    (band,) = bands
    assert band is not None  # refused above
    return band.k


def _fixed_trace(block: dict[str, Any], key: str, max_conc: int, out: Path | None, where: str) -> Path:
    from loadgen.recipe.infx_fixed import write_fixed_trace  # numpy: loaded only for a fixed-seq-len scenario

    isl, osl = block.get("isl"), block.get("osl")
    if not (isinstance(isl, int) and isinstance(osl, int) and isl > 0 and osl > 0):
        raise InfxConfigError(f"{where}: a fixed-seq-len block needs positive isl and osl, got {isl!r}, {osl!r}")
    if out is None:
        raise InfxConfigError(f"--out: {where} is a fixed-seq-len scenario; its requests are written as a trace "
                              "file beside the recipe, so give the recipe's path")
    return write_fixed_trace(out.with_name(f"{key}-isl{isl}-osl{osl}.jsonl").resolve(), isl, osl, max_conc)


def _describe(space: dict[str, Any], block: dict[str, Any] | None = None) -> str:
    parts = [f"isl {block['isl']}, osl {block['osl']}"] if block and "isl" in block else []
    parts += [f"{name} {space[name]}" for name in ("tp", "ep", "pp", "dcp-size", "pcp-size") if name in space]
    parts += ["dp-attn"] if space.get("dp-attn") else []
    parts += [f"kv-offloading {space['kv-offloading']}"] if "kv-offloading" in space else []
    parts += [f"spec-decoding {space['spec-decoding']}"] if "spec-decoding" in space else []
    conc = space.get("conc-list") or f"{space.get('conc-start')}..{space.get('conc-end')}"
    return ", ".join(parts + [f"conc {conc}"])


def _variant_name(topology: Topology) -> str:
    name = f"tp{topology.tp}" + (f"-ep{topology.ep}" if topology.ep > 1 else "")
    return name + ("-dpattn" if topology.dp_attn else "")


def to_yaml(recipe: dict[str, Any]) -> str:
    """YAML in the recipe schema's form: flags that are mappings stay mappings."""
    return yaml.safe_dump(recipe, sort_keys=False, default_flow_style=None)


# ---- command line ---------------------------------------------------------------------------

_DEFAULTS = FromInfxOptions()


def register_from_infx(actions: argparse._SubParsersAction) -> None:
    """Add `from-infx` to `loadgen recipe`'s actions."""
    p = actions.add_parser(
        "from-infx", help="a recipe from one InferenceX benchmark-config entry",
        description="Turn one entry of an InferenceX master config (model prefix, topology, KV offloading, "
        "concurrency list, speculative decoding) into a recipe for our server, a vLLM or SGLang command or a URL. "
        "The draft length is the one InferenceX's launch script runs, the golden AL the entry's model prefix's at "
        "that length, as InferenceX selects it.")
    p.add_argument("config", metavar="CONFIG", help="InferenceX master config YAML (configs/*-master.yaml)")
    p.add_argument("key", metavar="KEY", help="entry name, e.g. dsv4-fp4-mi355x-vllm-agentic-mtp")
    p.add_argument("--entry", type=int, default=_DEFAULTS.entry, metavar="N",
                   help="search-space entry index (default: every entry, one recipe each: FILE.N.yaml with --out)")
    p.add_argument("--scenario", choices=SCENARIOS, default=_DEFAULTS.scenario,
                   help=f"which scenario (default: {AGENTIC_SCENARIO} when the entry has it)")
    p.add_argument("--server", choices=SERVERS, default=_DEFAULTS.server,
                   help=f"what serves it (default: {_DEFAULTS.server})")
    p.add_argument("--url", default=_DEFAULTS.url, help="--server url: base URL of the running server")
    # dest server_command: `command` is the top-level parser's (`loadgen COMMAND`), which errors name
    p.add_argument("--command", dest="server_command", default=_DEFAULTS.command,
                   help="--server vllm|sglang: command line with {port} (default: vllm serve MODEL --port {port}, or "
                   "python -m sglang.launch_server --model-path MODEL --port {port})")
    p.add_argument("--spec-k", type=int, default=_DEFAULTS.spec_k, metavar="K",
                   help="num_speculative_tokens (default: the one InferenceX's launch script for the entry runs)")
    p.add_argument("--thinking", choices=THINKING_MODES, default=_DEFAULTS.thinking,
                   help=f"golden AL thinking mode (default: {_DEFAULTS.thinking}, as InferenceX)")
    p.add_argument("--golden-al", default=_DEFAULTS.golden_al, metavar="REF",
                   help="golden AL curve (default: the entry's model prefix)")
    p.add_argument("--model-preset", default=_DEFAULTS.model_preset,
                   help=f"--server ours: engine preset standing in for the model (default: {_DEFAULTS.model_preset})")
    p.add_argument("--offload-gb", type=int, default=_DEFAULTS.offload_gb, metavar="GB",
                   help="KV offload budget in GB (default: InferenceX's for the entry's node)")
    p.add_argument("--duration", type=float, default=_DEFAULTS.duration_s, metavar="S",
                   help=f"measurement window per level, s (default: {_DEFAULTS.duration_s:g}, InferenceX's agentic)")
    p.add_argument("--out", metavar="FILE", help="write the recipe here (default: print it)")
    p.set_defaults(func=run_from_infx)


def run_from_infx(args: argparse.Namespace) -> int:
    from loadgen.errors import UsageError

    options = replace(_DEFAULTS, server=args.server, url=args.url, command=args.server_command, entry=args.entry,
                      scenario=args.scenario, spec_k=args.spec_k, thinking=args.thinking, golden_al=args.golden_al,
                      model_preset=args.model_preset, duration_s=args.duration, offload_gb=args.offload_gb)
    path = Path(args.config)
    out = Path(args.out) if args.out else None
    try:
        entry = read_entry(path, args.key)
        count = 1 if args.entry is not None else len(search_spaces(entry, f"{path}: {args.key}", args.scenario)[1])
    except InfxConfigError as exc:
        raise UsageError(str(exc)) from None
    recipes = _recipes(options, out, count)
    skipped, written = [], 0
    for options_i, out_i, which in recipes:
        try:
            text = _recipe_text(entry, args.key, options_i, path, out_i)
        except (InfxConfigError, RecipeError) as exc:
            if len(recipes) == 1:
                raise UsageError(str(exc)) from None
            skipped.append(f"entry {options_i.entry}: {exc}")
            print(f"loadgen recipe from-infx: skipped search-space {skipped[-1]}", file=sys.stderr)
            continue
        _emit(text, out_i, f"{path.name} {args.key}{which}", separate=written > 0)
        written += 1
    if len(skipped) == len(recipes):
        raise UsageError(f"{path}: {args.key}: none of its {count} search-space entries has a recipe form: "
                         + "; ".join(skipped))
    return 0


def _recipes(options: FromInfxOptions, out: Path | None, count: int) -> list[tuple[FromInfxOptions, Path | None, str]]:
    """The recipes to make, each as its options, file and what its header names of the command: one, or for
    several search-space entries and no --entry one each, as InferenceX runs each of them."""
    if count <= 1:
        return [(options, out, "")]
    return [(replace(options, entry=index), None if out is None else out.with_name(f"{out.stem}.{index}{out.suffix}"),
             f" --entry {index}") for index in range(count)]


def _recipe_text(entry: dict[str, Any], key: str, options: FromInfxOptions, path: Path, out: Path | None) -> str:
    recipe = recipe_dict(entry, key, options, str(path), out)
    recipe_from_dict(recipe, f"the recipe made from {path}")  # what it writes, `recipe check` accepts
    return to_yaml(recipe)


def _emit(text: str, out: Path | None, command: str, separate: bool = False) -> None:
    """Write one recipe to `out`, or print it (a YAML document separator before all but the first)."""
    header = f"# generated by `loadgen recipe from-infx {command}`\n"
    if out is not None:
        out.write_text(header + text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        print(("---\n" if separate else "") + header + text, end="")
