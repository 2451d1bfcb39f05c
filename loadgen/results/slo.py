"""Service-level objectives: per-request bounds on the latency metrics, and the named tiers.

An SLO is a set of bounds, each on one per-request metric (README, "Metric definitions"):
`ttft`, `tpot`, `e2el`, `norm_e2el` (E2EL / OSL) with `<=` and a unit (`2s`, `500ms`, `800us`),
and `interactivity` (1 / TPOT, tokens/s/user) with `>=` (`50` or `50tok/s`). A request is *good*
when it completed and met every bound; a bound on TPOT or interactivity holds for a request that
has no TPOT (one output token, or all of them in one chunk: no decode interval to judge). Failed
requests (errors, timeouts, cancelled) are never good.

What a level attains against an SLO, with its interval, and its goodput: loadgen/results/attainment.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadgen.defaults import DEFAULTS
from loadgen.results.metric_registry import METRIC_BY_NAME, METRICS

DEFAULT_TARGET = DEFAULTS.attainment  # the share of requests that must be good for a level to hold the SLO

_LATENCY_UNITS = {"s": 1e6, "ms": 1e3, "us": 1.0}  # the units a latency bound accepts
# the metrics a bound may name; their request columns and directions are the registry's
_BOUNDED = tuple(metric.name for metric in METRICS if metric.column)
_NAMED = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*)=(.+)$")  # "fast=ttft<=1s": "ttft<" is no name
_BOUND = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=|<|>|=)\s*([0-9.eE+-]+)\s*([a-z/]*)\s*$")


class SloError(ValueError):
    """An SLO that cannot be read or cannot be met; the message names the bound."""


@dataclass(frozen=True, slots=True)
class Bound:
    """One per-request bound: `metric op value`, latencies held in microseconds (the request
    columns' unit), interactivity in tokens/s."""

    metric: str
    op: str  # "<=" | ">="
    value: float
    text: str  # as the user wrote it, normalised: "ttft<=2s"

    @property
    def column(self) -> str:
        """The request column the bound reads (interactivity reads TPOT: 1e6 / tpot_us)."""
        column = METRIC_BY_NAME[self.metric].column
        assert column is not None, "a bounded metric has a request column"
        return column


@dataclass(frozen=True, slots=True)
class Slo:
    """A named set of bounds; `text` is theirs, comma-joined (the results file's `spec`)."""

    name: str
    bounds: tuple[Bound, ...]

    @property
    def text(self) -> str:
        return ",".join(bound.text for bound in self.bounds)


# Named tiers. The bounds are per request, on the agentic sessions' own shape (contexts of 10k-150k
# tokens, mostly served from the prefix cache): "interactive" is a developer watching the agent
# type, "standard" an agent working on its own at a usual API's pace, "batch" background agents
# where only progress matters. AgentPerf's published tiers span 20-180 output tok/s per user.
TIERS: dict[str, str] = {
    "interactive": "ttft<=2s,interactivity>=50",
    "standard": "ttft<=5s,interactivity>=20",
    "batch": "ttft<=30s,interactivity>=5",
}
DEFAULT_SLOS = tuple(TIERS)  # every level reports these when no --slo is given


def parse_slo(text: str, tiers: Mapping[str, str] | None = None, name: str | None = None) -> Slo:
    """A tier name (`standard`; `tiers` adds a recipe's own), bounds (`ttft<=2s,interactivity>=50`)
    or named bounds (`fast=ttft<=1s,interactivity>=80`); SloError naming the bound otherwise."""
    known = {**TIERS, **(tiers or {})}
    key = text.strip()
    if name is None and (named := _NAMED.match(key)) is not None:
        return parse_slo(named.group(2), name=named.group(1))
    if key in known:
        return parse_slo(known[key], name=key)
    if not key:
        raise SloError("empty SLO: give a tier (" + ", ".join(known) + ") or bounds like 'ttft<=2s,interactivity>=50'")
    bounds: list[Bound] = []
    for part in key.split(","):
        if not part.strip():
            raise SloError(f"{text!r}: an empty bound between commas")
        bound = _parse_bound(part, known)
        if any(b.metric == bound.metric for b in bounds):
            raise SloError(f"{part.strip()!r}: a second bound on {bound.metric}; give one per metric")
        bounds.append(bound)
    return Slo(name or ",".join(bound.text for bound in bounds), tuple(bounds))


def _parse_bound(part: str, known: Mapping[str, str]) -> Bound:
    match = _BOUND.match(part.lower())
    shown = part.strip()
    if match is None:
        raise SloError(f"{shown!r}: expected METRIC<=VALUE or METRIC>=VALUE, e.g. ttft<=2s or interactivity>=50 "
                       f"(or a tier: {', '.join(known)})")
    metric, op, number, unit = match.groups()
    if metric not in _BOUNDED:
        raise SloError(f"{shown!r}: unknown metric {metric!r}; known: {', '.join(_BOUNDED)}")
    higher_better = METRIC_BY_NAME[metric].higher_is_better
    wanted = ">=" if higher_better else "<="
    if op.rstrip("=") != wanted[0] or op == "=":
        what = "a lower bound (>=): more tokens/s is better" if higher_better else "an upper bound (<=): less is better"
        raise SloError(f"{shown!r}: {metric} takes {what}")
    try:
        value = float(number)
    except ValueError:
        raise SloError(f"{shown!r}: {number!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise SloError(f"{shown!r}: the bound must be a positive finite number")
    if higher_better:
        if unit not in ("", "tok/s"):
            raise SloError(f"{shown!r}: interactivity is in tokens/s/user (write 50 or 50tok/s), not {unit!r}")
        if value > 1e6:  # a TPOT under the 1 us the latencies are recorded in
            raise SloError(f"{shown!r}: no request can meet it: over 1e6 tok/s is a TPOT under 1 us")
        return Bound(metric, ">=", value, f"{metric}>={value:g}")
    if unit not in _LATENCY_UNITS:
        raise SloError(f"{shown!r}: give the unit of {metric}: s, ms or us (e.g. {metric}<={number}s)")
    micros = value * _LATENCY_UNITS[unit]
    if micros < 1:
        raise SloError(f"{shown!r}: no request can meet it: latencies are recorded in whole microseconds")
    return Bound(metric, "<=", micros, f"{metric}<={value:g}{unit}")


def parse_slos(texts: Sequence[str], tiers: Mapping[str, str] | None = None) -> tuple[Slo, ...]:
    """Several --slo values (each a tier or bounds); the same name twice is an error."""
    slos = tuple(parse_slo(text, tiers) for text in texts)
    names = [slo.name for slo in slos]
    for name in names:
        if names.count(name) > 1:
            raise SloError(f"{name!r} is given twice")
    return slos


def check_target(target: float, flag: str = "--attainment") -> float:
    """A target share of good requests: within (0, 1]; SloError naming the flag."""
    if not 0 < target <= 1:
        raise SloError(f"{flag}: the target share of good requests must be in (0, 1], got {target:g}")
    return target


