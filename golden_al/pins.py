"""What InferenceX fixes for speculative decoding in its agentic benchmarks (golden_al/infx_pins.yaml):
the golden-AL curve each model prefix's scripts cite, the draft head its vLLM scripts name, and the
draft length k (with the AL it pins) each single-node launch script runs, by concurrency where the
script picks it so.

`curve_name(prefix)` is what `load_curve` selects by model prefix for the families upstream's
prefix -> model-key table does not name; `find_pin(prefix, precision, hw, framework)` is the launch
script of a master-config entry; `Pin.draft(conc)` its draft length at one concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PINS_FILE = Path(__file__).with_name("infx_pins.yaml")
THINKING_MODES = ("on", "off")
THINKING_CHOICES = ("auto", *THINKING_MODES)  # auto: each request's mode from its trace (loadgen replay)
THINKING = "on"  # InferenceX's default THINKING_MODE: every pinned script measures it


@dataclass(frozen=True, slots=True)
class Draft:
    """One band of a script's draft lengths: k and the AL pinned for concurrencies up to `max_conc`
    (None: every higher concurrency)."""

    k: int
    al: float
    max_conc: int | None = None

    def describe(self) -> str:
        return f"k={self.k} (AL {self.al:g})"


@dataclass(frozen=True, slots=True)
class Pin:
    """One InferenceX launch script and the draft lengths it runs."""

    script: str
    prefix: str
    precision: str
    hw: str
    framework: str
    drafts: tuple[Draft, ...]

    def draft(self, conc: int) -> Draft | None:
        """The band that holds `conc`; None: the script runs that concurrency without drafts."""
        for band in self.drafts:
            if band.max_conc is None or conc <= band.max_conc:
                return band
        return None

    def describe(self) -> str:
        """'k=3 (AL 3.39)', or the bands: 'conc <= 8: k=7 (AL 3.84); conc <= 16: ...; above: no drafts'."""
        if len(self.drafts) == 1 and self.drafts[0].max_conc is None:
            return self.drafts[0].describe()
        parts = [f"conc <= {band.max_conc}: " + band.describe() if band.max_conc is not None
                 else "higher: " + band.describe() for band in self.drafts]
        if self.drafts[-1].max_conc is not None:
            parts.append("higher: no drafts")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Head:
    """A family's draft head as vLLM names it: the method, and the draft model a separate head needs."""

    method: str
    model: str | None = None


class PinsError(ValueError):
    """A pins file that does not say what this module reads; names the file and entry."""


@cache
def _document() -> dict[str, Any]:
    import yaml  # here, not at the top: the server imports golden_al before it needs this file

    document = yaml.safe_load(PINS_FILE.read_text(encoding="utf-8"))
    if not isinstance(document, dict) or not isinstance(document.get("curves"), dict) \
            or not isinstance(document.get("scripts"), list):
        raise PinsError(f"{PINS_FILE}: expected `curves` (prefix: curve) and `scripts` (a list)")
    return document


def prefixes() -> list[str]:
    """The model prefixes whose scripts cite a curve."""
    return list(_document()["curves"])


def curve_name(prefix: str) -> str | None:
    """The bundled curve InferenceX's scripts cite for a model prefix; None when the file names none."""
    return _document()["curves"].get(prefix)


def head(prefix: str) -> Head | None:
    """The draft head InferenceX's vLLM scripts name for a model prefix; None when the file names none."""
    entry = _document().get("heads", {}).get(prefix)
    return None if entry is None else Head(str(entry["method"]), entry.get("model"))


@cache
def pins() -> tuple[Pin, ...]:
    """Every launch script of the file, in file order."""
    return tuple(_pin(entry, i) for i, entry in enumerate(_document()["scripts"]))


def find_pin(prefix: str, precision: str, hw: str, framework: str) -> Pin | None:
    """The launch script InferenceX runs for an entry of these keys; None when the file has none."""
    key = (prefix, precision, hw, framework)
    return next((pin for pin in pins() if (pin.prefix, pin.precision, pin.hw, pin.framework) == key), None)


def _pin(entry: Any, index: int) -> Pin:
    where = f"{PINS_FILE}: scripts[{index}]"
    try:
        drafts = tuple(Draft(int(band["k"]), float(band["al"]), band.get("max_conc")) for band in entry["drafts"])
        pin = Pin(str(entry["script"]), str(entry["prefix"]), str(entry["precision"]), str(entry["hw"]),
                  str(entry["framework"]), drafts)
    except (KeyError, TypeError, ValueError) as exc:
        raise PinsError(f"{where}: expected script, prefix, precision, hw, framework and drafts [{{k, al}}]: "
                        f"{exc!r}") from None
    if not drafts or any(band.max_conc is None for band in drafts[:-1]):
        raise PinsError(f"{where}: drafts: needs at least one band, and only the last may omit max_conc")
    return pin
