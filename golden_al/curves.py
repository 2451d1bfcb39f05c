"""Golden acceptance-length curves: find, read and validate the YAML files, look up AL by k and mode.

A curve file follows the InferenceX `golden_al_distribution/` format, one model per file:

    # method: MTP                     (header comments `# key: value` are kept as provenance)
    <model-key>:
      thinking_on:  {1: AL, 2: AL, ...}
      thinking_off: {1: AL, ...}      (optional)

AL is the mean number of tokens emitted per verify step (accepted drafts + the verified token),
so at draft length k it must lie in [1, k + 1].
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

DATA_DIR = Path(__file__).parent / "data"
MODES = ("thinking_on", "thinking_off")
_HEADER_FIELD = re.compile(r"#\s*([a-z_]+):\s*(.*\S)\s*$")


class CurveError(ValueError):
    """A curve that cannot be found, read or used as asked; the message names the file and key."""


def mode_name(thinking: bool) -> str:
    return "thinking_on" if thinking else "thinking_off"


@dataclass(frozen=True)
class Curve:
    name: str
    model_key: str
    source: Path
    modes: dict[str, dict[int, float]]
    provenance: dict[str, str]  # the file's header `# key: value` comments (source, dataset, method)

    @property
    def method(self) -> str:
        return self.provenance.get("method", "")

    def has(self, k: int, thinking: bool) -> bool:
        return k in self.modes.get(mode_name(thinking), {})

    def al(self, k: int, thinking: bool) -> float:
        mode = mode_name(thinking)
        if not self.has(k, thinking):
            raise CurveError(
                f"curve {self.name!r} ({self.source}) has no {mode} AL at k={k}; "
                f"it has: {self.describe_points()}"
            )
        return self.modes[mode][k]

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


def load_curve(name_or_path: str) -> Curve:
    """A bundled curve by name, or any curve file by path."""
    if name_or_path in list_curves():
        return _read_curve(DATA_DIR / f"{name_or_path}.yaml")
    path = Path(name_or_path)
    if path.is_file():
        return _read_curve(path)
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        raise CurveError(f"curve file {name_or_path} does not exist")
    raise CurveError(
        f"unknown curve {name_or_path!r}; bundled curves: {', '.join(list_curves())} "
        "(or give a path to a YAML file)"
    )


def _read_curve(path: Path) -> Curve:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CurveError(f"{path}: cannot read curve file: {exc}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CurveError(f"{path}: malformed YAML: {exc}") from exc
    if not isinstance(document, dict) or len(document) != 1:
        raise CurveError(f"{path}: expected exactly one top-level model key mapping to its modes")
    [(model_key, body)] = document.items()
    if not isinstance(body, dict) or not body:
        raise CurveError(f"{path}: {model_key}: expected a mapping of thinking_on/thinking_off")
    modes = {}
    for mode, points in body.items():
        if mode not in MODES:
            raise CurveError(f"{path}: {model_key}.{mode}: unknown mode; expected one of {MODES}")
        modes[mode] = _read_points(points, f"{path}: {model_key}.{mode}")
    return Curve(
        name=path.stem,
        model_key=str(model_key),
        source=path,
        modes=modes,
        provenance=_read_header(text),
    )


def _read_points(points: object, where: str) -> dict[int, float]:
    if not isinstance(points, dict) or not points:
        raise CurveError(f"{where}: expected a non-empty mapping {{k: AL}}")
    checked = {}
    for k, al in points.items():
        # bool is an int subclass; `true: 2.0` is a typo, not k=1.
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise CurveError(f"{where}.{k}: k must be an integer >= 1")
        if isinstance(al, bool) or not isinstance(al, (int, float)):
            raise CurveError(f"{where}.{k}: AL must be a number, got {al!r}")
        if not (math.isfinite(al) and 1 <= al <= k + 1):
            raise CurveError(f"{where}.{k}: AL {al} outside [1, {k + 1}] for k={k}")
        checked[k] = float(al)
    return dict(sorted(checked.items()))


def _read_header(text: str) -> dict[str, str]:
    """`# key: value` lines of the leading comment block."""
    fields = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        match = _HEADER_FIELD.match(line)
        if match:
            fields[match.group(1)] = match.group(2)
    return fields
