"""Golden acceptance-length curves: find, read and validate the YAML files, look up AL by k and mode.

Files follow InferenceX's `golden_al_distribution/` and reference-AL formats and are read
unchanged. A file maps one or more model keys to a curve in any of three forms:

    <model-key>:                       thinking matrix
      thinking_on:  {1: AL, 2: AL, ...}
      thinking_off: {1: AL, ...}       (optional)
    <model-key>: {1: AL, 2: AL}        plain {k: AL}, one curve for every thinking mode
    <model-key>: [{1: AL}, {2: AL}]    flat list of single-key {k: AL} items, likewise

A cell `N/A` is a measurement that failed (the collector writes it): that k is simply absent.
A top-level `_metadata` mapping (e.g. `draft-model`) is kept as provenance, not read as a model.
The leading comment block is provenance too: `# key: value` lines (ours: source, dataset,
method; upstream's `# Source GitHub Actions run: URL` is read as the source).

AL is the mean number of tokens emitted per verify step (accepted drafts + the verified token),
so at draft length k it must lie in [1, k + 1].

Selecting a curve (`load_curve`), in this order:
1. a bundled curve name (file stem in golden_al/data/) or a path to a YAML file; a file with
   several models needs `NAME:MODEL` or `FILE:MODEL`;
2. a model prefix or model key, the way InferenceX selects: a prefix whose launch scripts cite
   one curve (golden_al/infx_pins.yaml: qwen3.5, glm5.2, kimik3, minimaxm3, kimik2.5) takes that
   curve; any other maps to a model key (InferenceX's own table below, else the prefix itself)
   and the one bundled curve of that model is taken; two curves of one model (e.g. two draft
   heads) are ambiguous and must be named. Such a curve is marked `selected_by == "model"`: its
   thinking modes are strict (loadgen/run/spec_decode.py fails on a missing mode, as InferenceX does,
   instead of falling back).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
MODES = ("thinking_on", "thinking_off")
ANY_MODE = "any"  # the plain and flat-list forms: one curve for every thinking mode
NOT_MEASURED = "N/A"
METADATA_KEY = "_metadata"
# InferenceX's MODEL_PREFIX -> model key table (its synthetic-acceptance injector); any other
# prefix is looked up as a model key itself.
MODEL_PREFIX_TO_KEY = {
    "dsv4": "deepseek-v4-pro",
    "dsr1": "deepseek-r1",
    "dsv4dspark": "deepseek-v4-pro-0813",
    "dsv4dsparkprob": "deepseek-v4-pro-0813",
}
_HEADER_FIELD = re.compile(r"#\s*([A-Za-z][\w -]*?):\s+(.*\S)\s*$")
_UPSTREAM_SOURCE = "Source GitHub Actions run"


class CurveError(ValueError):
    """A curve that cannot be found, read or used as asked; the message names the file and key."""


def mode_name(thinking: bool) -> str:
    return "thinking_on" if thinking else "thinking_off"


@dataclass(frozen=True)
class Curve:
    name: str
    model_key: str
    source: Path
    modes: dict[str, dict[int, float]]  # thinking_on / thinking_off, or ANY_MODE
    provenance: dict[str, str]  # header `# key: value` comments and `_metadata` (source, dataset, method)
    not_measured: dict[str, list[int]] = field(default_factory=dict)  # N/A cells per mode
    selected_by: str = "name"  # "name" (bundled name or file) or "model" (prefix / model key)

    @property
    def method(self) -> str:
        return self.provenance.get("method", "")

    def points(self, thinking: bool) -> dict[int, float] | None:
        return self.modes.get(ANY_MODE, self.modes.get(mode_name(thinking)))

    def has(self, k: int, thinking: bool) -> bool:
        return k in (self.points(thinking) or {})

    def al(self, k: int, thinking: bool) -> float:
        points = self.points(thinking)
        if points is None or k not in points:  # not self.has(k, thinking)
            raise CurveError(
                f"curve {self.name!r} ({self.source}) has no {mode_name(thinking)} AL at k={k}; "
                f"it has: {self.describe_points()}"
            )
        return points[k]

    def describe_points(self) -> str:
        """What exists, e.g. 'thinking_on k=1..8, thinking_off k=1..8' or 'thinking_on k=5'."""
        return ", ".join(f"{mode} k={format_ks(ks)}" for mode, ks in self.modes.items())


def format_ks(ks: dict[int, float] | list[int]) -> str:
    """Compact k list: '1..8' for a contiguous run, else comma-separated."""
    ordered = sorted(ks)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}"
    return ",".join(str(k) for k in ordered)


def list_curves() -> list[str]:
    """Names of the bundled curves (file stems in golden_al/data/), sorted."""
    return sorted(path.stem for path in DATA_DIR.glob("*.yaml"))


def bundled_curves() -> list[Curve]:
    """Every model curve of every bundled file."""
    return [curve for name in list_curves() for curve in read_curves(DATA_DIR / f"{name}.yaml")]


def load_curve(ref: str) -> Curve:
    """A curve by bundled name, file path, `NAME|FILE:MODEL`, or model prefix / key (see above)."""
    path, model = _file_of(ref)
    if path is not None:
        return _one_model(read_curves(path), path, model)
    file_part = ref.rsplit(":", 1)[0] if ":" in ref else ref
    if file_part.endswith((".yaml", ".yml")) or "/" in file_part:
        raise CurveError(f"curve file {file_part} does not exist")
    return select_by_model(ref)


def select_by_model(prefix: str) -> Curve:
    """InferenceX's selection: the curve its scripts cite for the prefix, else model prefix -> model key
    -> the bundled curve of that model."""
    from golden_al.pins import curve_name

    cited = curve_name(prefix)
    key = MODEL_PREFIX_TO_KEY.get(prefix, prefix)
    matches = [curve for curve in bundled_curves() if (curve.name == cited if cited else curve.model_key == key)]
    if len(matches) > 1:
        raise CurveError(f"model {key!r} has several bundled curves ({', '.join(c.name for c in matches)}); "
                         "name one of them")
    if not matches:
        from golden_al.pins import prefixes

        known = sorted({*MODEL_PREFIX_TO_KEY, *prefixes(), *(c.model_key for c in bundled_curves())})
        raise CurveError(f"unknown curve {prefix!r}; bundled curves: {', '.join(list_curves())}; model prefixes "
                         f"and keys: {', '.join(known)} (or give a path to a YAML file)")
    chosen = matches[0]
    return Curve(chosen.name, chosen.model_key, chosen.source, chosen.modes, chosen.provenance,
                 chosen.not_measured, selected_by="model")


def _file_of(ref: str) -> tuple[Path | None, str | None]:
    """(file, model) when `ref` names a bundled curve or an existing file, optionally `:MODEL`."""
    candidates: list[tuple[str, str | None]] = [(ref, None)]
    if ":" in ref:
        name, suffix = ref.rsplit(":", 1)
        candidates.append((name, suffix))
    for text, model in candidates:
        if text in list_curves():
            return DATA_DIR / f"{text}.yaml", model
        if Path(text).is_file():
            return Path(text), model
    return None, None


def _one_model(curves: list[Curve], path: Path, model: str | None) -> Curve:
    if model is not None:
        for curve in curves:
            if curve.model_key == model:
                return curve
        raise CurveError(f"{path}: no model {model!r}; it has: {', '.join(c.model_key for c in curves)}")
    if len(curves) > 1:
        raise CurveError(f"{path} holds several models ({', '.join(c.model_key for c in curves)}); "
                         f"choose one with {path}:MODEL")
    return curves[0]


def read_curves(path: Path) -> list[Curve]:
    """Every model curve of one file, in file order."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CurveError(f"{path}: cannot read curve file: {exc}") from exc
    import yaml  # here, not at the top: `loadgen replay` imports this module before its first request

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CurveError(f"{path}: malformed YAML: {exc}") from exc
    if not isinstance(document, dict):
        raise CurveError(f"{path}: expected a mapping of model keys to curves")
    provenance = _read_header(text)
    metadata = document.get(METADATA_KEY, {})
    if not isinstance(metadata, dict):
        raise CurveError(f"{path}: {METADATA_KEY}: expected a mapping")
    provenance.update({str(key): str(value) for key, value in metadata.items()})
    models = {key: body for key, body in document.items() if key != METADATA_KEY}
    if not models:
        raise CurveError(f"{path}: expected at least one top-level model key mapping to its curve")
    several = len(models) > 1
    curves = []
    for model_key, body in models.items():
        modes, not_measured = _read_body(body, f"{path}: {model_key}")
        name = f"{path.stem}:{model_key}" if several else path.stem
        curves.append(Curve(name, str(model_key), path, modes, provenance, not_measured))
    return curves


def _read_body(body: object, where: str) -> tuple[dict[str, dict[int, float]], dict[str, list[int]]]:
    """A model's curve in any of the three forms -> ({mode: {k: AL}}, {mode: [N/A ks]})."""
    if isinstance(body, list):
        return _read_modes({ANY_MODE: _merge_flat_list(body, where)}, where, flat=True)
    if isinstance(body, dict) and body and all(str(key).startswith("thinking") for key in body):
        for mode in body:
            if mode not in MODES:
                raise CurveError(f"{where}.{mode}: unknown mode; expected one of {MODES}")
        return _read_modes(body, where)
    if isinstance(body, dict) and body:
        return _read_modes({ANY_MODE: body}, where, flat=True)
    raise CurveError(f"{where}: expected a mapping of thinking_on/thinking_off, a {{k: AL}} mapping "
                     "or a list of {k: AL} items")


def _merge_flat_list(items: list, where: str) -> dict:
    merged: dict = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict) or len(item) != 1:
            raise CurveError(f"{where}[{index}]: expected a single-key {{k: AL}} mapping, got {item!r}")
        [(k, al)] = item.items()
        if k in merged:
            raise CurveError(f"{where}[{index}]: k={k} appears twice")
        merged[k] = al
    return merged


def _read_modes(body: dict, where: str, flat: bool = False) -> tuple[dict, dict]:
    modes, not_measured = {}, {}
    for mode, points in body.items():
        place = where if flat else f"{where}.{mode}"
        modes[mode], missing = _read_points(points, place)
        if missing:
            not_measured[mode] = missing
        if not modes[mode]:
            raise CurveError(f"{place}: no measured AL (every cell is {NOT_MEASURED})")
    return modes, not_measured


def _read_points(points: object, where: str) -> tuple[dict[int, float], list[int]]:
    if not isinstance(points, dict) or not points:
        raise CurveError(f"{where}: expected a non-empty mapping {{k: AL}}")
    checked, missing = {}, []
    for k, al in points.items():
        # bool is an int subclass; `true: 2.0` is a typo, not k=1.
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise CurveError(f"{where}.{k}: k must be an integer >= 1")
        if al == NOT_MEASURED:
            missing.append(k)
            continue
        if isinstance(al, bool) or not isinstance(al, (int, float)):
            raise CurveError(f"{where}.{k}: AL must be a number or {NOT_MEASURED}, got {al!r}")
        if not (math.isfinite(al) and 1 <= al <= k + 1):
            raise CurveError(f"{where}.{k}: AL {al} outside [1, {k + 1}] for k={k}")
        checked[k] = float(al)
    return dict(sorted(checked.items())), sorted(missing)


def _read_header(text: str) -> dict[str, str]:
    """`# key: value` lines of the leading comment block; upstream's run URL becomes `source`."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        match = _HEADER_FIELD.match(line)
        if match:
            key = "source" if match.group(1) == _UPSTREAM_SOURCE else match.group(1)
            fields.setdefault(key, match.group(2))
    return fields
