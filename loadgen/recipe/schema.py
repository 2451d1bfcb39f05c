"""The recipe schema: one A/B experiment as a frozen dataclass tree, read from and written to YAML.

A recipe names the server (ours started as `python -m server.cli start`, the in-process engine,
an external command line such as `vllm serve`, or a URL), the workload (traces and their
scaling, think time, golden AL and thinking mode), the sweep (concurrencies or rates, window,
warm-up, repeats, seed) and the variants (overrides of the server's flags, environment and
working directory; the first is the baseline, a control copies it).

Build one programmatically (`Recipe(...)`, or `recipe_from_dict`) and write it with `to_dict` /
`to_yaml`; `recipe_from_dict(to_dict(r)) == r`. Every error is a RecipeError naming the key
(`server.kind`, `variants[1].flags`, ...); the cross-field rules are in loadgen/recipe/validate.py.
Server-flag names are checked against the engine's own flags later, by `loadgen recipe check`.
Defaults the replay has too (window, warm-up, seed, endpoint) are read from its config (loadgen/defaults.py),
the traces' scaling from traces/scale.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

from golden_al.pins import THINKING_CHOICES
from loadgen.capacity.config import DEFAULT_SLO, OVER, SEARCH
from loadgen.defaults import COMPARE, ENDPOINTS
from loadgen.defaults import DEFAULTS as REPLAY
from loadgen.run.affinity import parse_cpus
from traces.scale import ScaleConfig

SCHEMA = "agentload.recipe/1"
SERVER_KINDS = ("ours", "inprocess", "command", "url")
SERVER_LIFETIMES = ("fresh", "kept")
PORT_PLACEHOLDER = "{port}"
SCALING = ScaleConfig()  # the traces' scaling defaults

# A flag value: a scalar, or a mapping/list given as JSON text on the command line
# (e.g. speculative_config). True means a bare switch (--no-prefix-caching); False leaves it out.
FlagValue = str | int | float | bool
Flags = tuple[tuple[str, FlagValue], ...]


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the file and key."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What serves the variants. `flags` are the baseline's: engine flags of `server start` for
    ours/inprocess (key spelled with _ or -, e.g. indexer_key_dtype: mxfp4), appended as
    `--key value` to `command` for an external server. A variant's flags override these."""

    kind: str = field(metadata={"choices": SERVER_KINDS})
    flags: Flags = ()
    command: str | None = None  # kind command: the command line, with {port} where the port goes
    url: str | None = None  # kind url: base URL of a running server (variants cannot change it)
    health_path: str = "/health"
    startup_timeout_s: float = 600.0  # bound on waiting for the health check to answer 200
    env: Flags = ()  # extra environment for the server process
    gpus: int | None = None  # GPUs behind the server, for throughput per GPU (default: server's own)
    cpus: str | None = None  # CPUs the server's processes run on, e.g. "1" or "2-7" (Linux; default: any)
    # the server process's working directory (kinds ours and command; default: loadgen's). For ours, a
    # folder holding another tree of this repository serves that tree's engine, driven by this loadgen.
    cwd: str | None = None
    image: str | None = None  # the container image (or package) the server runs: recorded with results, not pulled

    def cpu_set(self) -> frozenset[int] | None:
        """`cpus` as a set (None: anywhere); CpuListError names the key."""
        return None if self.cpus is None else parse_cpus(self.cpus, "server.cpus")


@dataclass(frozen=True, slots=True)
class Workload:
    """The sessions replayed, and how they are scaled; `None` keeps the replay's default."""

    traces: str | None = None  # bundled set name, trace file or folder (default: agentic-coding)
    token_scale: float = SCALING.token_scale
    think_time_scale: float = SCALING.think_time_scale
    think_time_cap: float | None = None
    max_context: int | None = None
    golden_al: str | None = None  # golden AL curve sent per request (HTTP servers; see `loadgen golden-al`)
    spec_k: int | None = None
    thinking: str | None = field(default=None, metadata={"choices": THINKING_CHOICES})
    endpoint: str = field(default=REPLAY.endpoint, metadata={"choices": ENDPOINTS})
    model: str | None = None  # model id to ask an HTTP server for (default: its first)
    timeout_s: float | None = None  # per-request limit (default: the replay's)


@dataclass(frozen=True, slots=True)
class CapacityMeasure:
    """Each run measures the capacity under `slo` (`loadgen capacity`; `bench --capacity` in-process)
    instead of fixed levels, and the variants' capacities are compared round by round. `slo`: a
    tier, one of the recipe's own `slos`, or bounds; the other keys are the search's (README,
    `loadgen capacity`), defaults as there."""

    slo: str = DEFAULT_SLO
    attainment: float = SEARCH.target
    over: str = field(default=SEARCH.over, metadata={"choices": OVER})
    open_loop: bool = False
    low: float | None = None
    high: float | None = None
    resolution: float = SEARCH.resolution
    max_probes: int = SEARCH.max_probes
    early_stop: bool = SEARCH.early_stop


@dataclass(frozen=True, slots=True)
class Sweep:
    """Levels of one run and how often each variant runs: `repeats` rounds, each round running
    every variant once (A B, B A, A B, ...: orders balanced for position and predecessor). `servers: fresh` starts
    a server for every run, each replaying `seed`; `kept` starts every variant's server once, side
    by side, before the first round (several of kind ours on one GPU: each with a share of its
    memory, loadgen/recipe/memory.py), and round k replays seed + k - 1, so that no prompt of an
    earlier round sits in a server's prefix cache."""

    conc: tuple[int, ...] | None = None
    rates: tuple[float, ...] | None = None
    capacity: CapacityMeasure | None = None  # instead of conc/rates: the capacity under an SLO, searched
    duration_s: float = REPLAY.duration_s
    warmup: str = REPLAY.warmup  # seconds ("30s") or requests per lane ("2req")
    repeats: int = 5
    seed: int = REPLAY.seed
    client_cpus: str | None = None  # CPUs the load generator runs on, e.g. "0" (Linux; default: any)
    servers: str = field(default="fresh", metadata={"choices": SERVER_LIFETIMES})

    def client_cpu_set(self) -> frozenset[int] | None:
        """`client_cpus` as a set (None: anywhere); CpuListError names the key."""
        return None if self.client_cpus is None else parse_cpus(self.client_cpus, "sweep.client_cpus")

    def seed_of(self, round_: int) -> int:
        """The load's seed in round `round_` (1-based)."""
        return self.seed + (round_ - 1 if self.servers == "kept" else 0)


@dataclass(frozen=True, slots=True)
class Variant:
    """A named set of overrides of the server's flags, environment and working directory.
    `control: true` marks a deliberate copy of the baseline (an A/A check); any other variant must
    override something."""

    name: str
    flags: Flags = ()
    env: Flags = ()
    cwd: str | None = None
    control: bool = False


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """How variants are compared with the baseline (loadgen/compare): the metrics (default all)
    and the false-discovery rate controlled over each comparison's (level, metric) family."""

    metrics: tuple[str, ...] | None = None
    fdr: float = COMPARE.fdr
    run_noise: str | None = None  # as `loadgen compare --run-noise`: PCT, or run_noise.json from an A/A calibration
    paired: bool = True  # round k of every variant compared together (`loadgen compare --paired`)


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    server: ServerConfig = field(
        metadata={"hint": ": what serves the variants (kind: ours, inprocess, command or url)"})
    variants: tuple[Variant, ...]
    sweep: Sweep = field(default_factory=Sweep)
    workload: Workload = field(default_factory=Workload)
    compare: CompareConfig = field(default_factory=CompareConfig)
    description: str = ""
    # the recipe's own SLO tiers, {name: bounds}; every run reports them (and the replay's tiers)
    slos: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        from loadgen.recipe.validate import validate_recipe  # it reads these types, so it imports this module

        validate_recipe(self)

    @property
    def baseline(self) -> Variant:
        return self.variants[0]

    def server_flags(self, variant: Variant) -> dict[str, FlagValue]:
        """The server flags of one variant: the server's, overridden by the variant's (a control's: the baseline's)."""
        return {**dict(self.server.flags), **dict(self._as_run(variant).flags)}

    def server_env(self, variant: Variant) -> dict[str, str]:
        return {key: str(value) for key, value in (*self.server.env, *self._as_run(variant).env)}

    def server_cwd(self, variant: Variant) -> str | None:
        """The working directory of the variant's server process (None: loadgen's)."""
        return self._as_run(variant).cwd or self.server.cwd

    def server_key(self, variant: Variant) -> tuple[dict[str, FlagValue], dict[str, str], str]:
        """What makes the variant's server, comparable between variants: flags, environment and the
        working directory as a real path (relative to loadgen's own)."""
        return self.server_flags(variant), self.server_env(variant), os.path.realpath(self.server_cwd(variant) or ".")

    def _as_run(self, variant: Variant) -> Variant:
        """A control runs as a copy of the baseline; any other variant as itself."""
        return self.baseline if variant.control else variant


# -- dict / YAML form ----------------------------------------------------------------------


def recipe_from_dict(data: Any, source: str = "recipe") -> Recipe:
    """Build a Recipe from its dict form (as read from YAML); RecipeError names `source` and the key."""
    try:
        if not isinstance(data, dict):
            raise RecipeError(f"expected a mapping at the top, got {type(data).__name__}")
        data = dict(data)
        schema = data.pop("schema", SCHEMA)
        if schema != SCHEMA:
            raise RecipeError(f"schema: expected {SCHEMA!r}, got {schema!r}")
        return _build(Recipe, data, "")
    except RecipeError as exc:
        raise RecipeError(f"{source}: {exc}") from None


def load_recipe(path: str) -> Recipe:
    """Read and validate a recipe file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    return recipe_from_dict(data, path)


def to_dict(recipe: Recipe) -> dict[str, Any]:
    """The dict form: only fields that differ from their defaults (plus the required ones)."""
    return {"schema": SCHEMA, **_plain(recipe)}


def to_yaml(recipe: Recipe) -> str:
    import yaml

    return yaml.safe_dump(to_dict(recipe), sort_keys=False, default_flow_style=None)


def _plain(obj: Any) -> Any:
    if is_dataclass(obj):
        out = {}
        for f in fields(obj):
            value = getattr(obj, f.name)
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else MISSING)
            if value != default:
                out[f.name] = _plain_field(f.name, value)
        return out
    return obj


def _plain_field(name: str, value: Any) -> Any:
    if name in ("flags", "env", "slos"):
        return {key: val for key, val in value}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return _plain(value)


def _build(cls: type, data: Any, path: str) -> Any:
    where = path or "recipe"
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping, got {_kind(data)}")
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = [key for key in data if key not in known]
    if unknown:
        raise RecipeError(f"{_join(path, str(unknown[0]))}: unknown key; known keys here: {', '.join(known)}")
    values = {}
    for name, f in known.items():
        key = _join(path, name)
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise RecipeError(f"{key}: missing (required){f.metadata.get('hint', '')}")
            continue
        value = _convert(hints[name], data[name], key, name)
        choices = f.metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise RecipeError(f"{key}: must be one of {', '.join(choices)}, got {value!r}")
        values[name] = value
    return cls(**values)


def _convert(hint: Any, value: Any, key: str, name: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if name == "slos":
        return _tiers(value, key)
    if hint is Flags or name in ("flags", "env"):
        return _flags(value, key)
    if origin is Union or (origin is not None and type(None) in args):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, key, name)
    if origin is tuple:
        if not isinstance(value, list):
            value = [value] if isinstance(value, (int, float, str)) and not isinstance(value, bool) else value
        if not isinstance(value, list):
            raise RecipeError(f"{key}: expected a list, got {_kind(value)}")
        return tuple(_convert(args[0], item, f"{key}[{i}]", name) for i, item in enumerate(value))
    if isinstance(hint, type) and is_dataclass(hint):
        return _build(hint, value, key)
    return _scalar(hint, value, key)


def _scalar(hint: Any, value: Any, key: str) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:  # YAML reads `cpus: 1` or `name: 7` as a number; the text is meant
        ok = isinstance(value, (str, int)) and not isinstance(value, bool)
        value = str(value) if ok else value
    else:
        raise TypeError(f"no converter for {hint!r} at {key}")
    if not ok:
        raise RecipeError(f"{key}: expected {_NAMES[hint]}, got {_kind(value)} {value!r}")
    return value


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _flags(value: Any, key: str) -> Flags:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise RecipeError(f"{key}: expected a mapping of flag: value, got {_kind(value)}")
    out = []
    for name, item in value.items():
        if not isinstance(name, str) or not name.strip("-"):
            raise RecipeError(f"{key}: flag names must be strings, got {name!r}")
        normalized = name.strip("-").replace("-", "_")
        if isinstance(item, (dict, list)):
            item = json.dumps(item)  # e.g. speculative_config, passed as JSON text
        elif item is None or not isinstance(item, (str, int, float, bool)):
            raise RecipeError(f"{key}.{name}: expected a string, number, true/false or mapping, got {_kind(item)}")
        out.append((normalized, item))
    return tuple(out)


def _tiers(value: Any, key: str) -> tuple[tuple[str, str], ...]:
    """`slos: {name: bounds}` as (name, bounds) pairs, names kept as written."""
    if not isinstance(value, dict):
        raise RecipeError(f"{key}: expected a mapping of tier name: bounds, got {_kind(value)}")
    for name, bounds in value.items():
        if not isinstance(name, str) or not isinstance(bounds, str):
            raise RecipeError(f"{key}.{name}: expected bounds as text, like 'ttft<=2s,interactivity>=50', got "
                              f"{_kind(bounds)}")
    return tuple(value.items())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false", type(None): "nothing"}.get(
        type(value), type(value).__name__)
