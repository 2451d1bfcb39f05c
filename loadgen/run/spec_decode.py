"""Speculative decoding in a replay: the acceptance length each request is expected to reach, and
the AL measured per level.

Expected AL: `loadgen replay --golden-al REF --spec-k K --thinking auto|on|off` picks it from a
golden curve (`golden_al`). REF is a bundled curve name or a file (`NAME|FILE[:MODEL]`), or a
model prefix / model key, which selects the model's one bundled curve the way InferenceX does
(golden_al/curves.py). With `auto` a request's thinking mode is its trace record's
(`output_types` contains "thinking"). A mode the curve lacks at k:
- curve chosen by name or file (ours): `auto` falls back to the other mode, with one warning;
- curve chosen by model prefix or key: an error, as InferenceX fails on a missing thinking mode
  (`--thinking on` or `off` picks the mode the curve has);
- `--thinking on|off` naming a missing mode: always an error.
A curve in the plain or flat-list form has one AL per k for every thinking mode.

When the target is our server (which then must run synthetic speculative decoding) the AL
travels in each request body as the extension field `acceptance_length`; any other server only
has it recorded as the expected value. `loadgen bench` and a replay without
`--golden-al` expect the server's own default AL (our /v1/models `speculative` card).

Measured AL = accepted tokens per verify step = (num_drafts + num_accepted_tokens) / num_drafts,
summed over the level's measured requests from `usage.spec_decode`; a server that reports no
such usage is measured from its /metrics counters (`vllm:spec_decode_num_drafts_total`,
`vllm:spec_decode_num_accepted_tokens_total`) scraped when the window opens and after the drain.
The expected value beside it is the mean of the ALs asked for, weighted by output tokens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from typing import Any, TextIO

from golden_al import Curve, CurveError, load_curve
from loadgen.telemetry.server_counters import (
    METRIC_ACCEPTED,
    METRIC_DRAFTS,
    SpecCounters,
    metric_totals,
    spec_counters_of,
)
from traces import Request


class SpecExpectation:
    """Which AL each request is expected to reach (and sent with, when `send`)."""

    def __init__(self, k: int, send: bool, al_on: float | None, al_off: float | None, source: str,
                 thinking: str, warn: TextIO | None = None) -> None:
        self.k = k
        self.send = send
        self.source = source  # the curve's name, or "server default"
        self.thinking = thinking  # "auto" | "on" | "off" | "server"
        self._al = {True: al_on, False: al_off}
        self._warn = warn or sys.stderr
        self._warned = False

    def al(self, request: Request) -> float:
        thinking = request.thinking if self.thinking == "auto" else self.thinking != "off"
        value = self._al[thinking]
        if value is None:
            value = self._al[not thinking]
            assert value is not None, "an expectation has at least one of the two ALs"
            if not self._warned:
                self._warned = True
                have, lack = ("on", "off") if not thinking else ("off", "on")
                print(f"loadgen: warning: curve {self.source!r} has no thinking_{lack} AL at k={self.k}; "
                      f"thinking_{lack} requests expect the thinking_{have} AL {value:g}", file=self._warn)
        return value

    def describe(self) -> dict[str, Any]:
        return {"k": self.k, "golden_al": self.source, "thinking": self.thinking,
                "al_thinking_on": self._al[True], "al_thinking_off": self._al[False],
                "sent_per_request": self.send}


def expectation_from_flags(golden_al: str | None, spec_k: int | None, thinking: str | None,
                           info_raw: dict[str, Any], ours: bool) -> SpecExpectation | None:
    """`loadgen replay`'s flags against the server's /v1/models entry; ValueError naming the flag."""
    card = server_card(info_raw)
    if golden_al is None:
        if spec_k is not None or thinking is not None:
            flag = "--spec-k" if spec_k is not None else "--thinking"
            raise ValueError(f"{flag}: only meaningful with --golden-al")
        return server_default(card)
    if spec_k is None:
        if card is None:
            raise ValueError("--spec-k: required with --golden-al (the server does not say its "
                             "num_speculative_tokens)")
        spec_k = card["num_speculative_tokens"]
    if spec_k < 1:
        raise ValueError(f"--spec-k: must be >= 1, got {spec_k}")
    if ours:
        if card is None or card.get("rejection_sample_method") != "synthetic":
            raise ValueError("--golden-al: the target is our server but it does not run synthetic speculative "
                             "decoding; start it with --speculative-config (rejection_sample_method synthetic)")
        if card["num_speculative_tokens"] != spec_k:
            raise ValueError(f"--spec-k: {spec_k}, but the server runs num_speculative_tokens="
                             f"{card['num_speculative_tokens']}")
    return _from_curve(_load(golden_al), spec_k, thinking or "auto", send=ours)


def _load(golden_al: str) -> Curve:
    try:
        return load_curve(golden_al)
    except CurveError as exc:
        raise ValueError(f"--golden-al: {exc}") from None


def _from_curve(curve: Curve, k: int, thinking: str, send: bool) -> SpecExpectation:
    on = curve.al(k, True) if curve.has(k, True) else None
    off = curve.al(k, False) if curve.has(k, False) else None
    # An explicit mode must exist; `auto` needs at least one (the other falls back to it), and
    # both when the curve was selected by model, InferenceX's way.
    needed = {"on": on, "off": off, "auto": on if on is not None else off}[thinking]
    if needed is None:
        try:
            curve.al(k, thinking != "off")
        except CurveError as exc:
            raise ValueError(f"--golden-al: {exc}") from None
    if thinking == "auto" and curve.selected_by == "model" and None in (on, off):
        lacking = "thinking_off" if off is None else "thinking_on"
        raise ValueError(f"--golden-al: curve {curve.name!r}, selected by model {curve.model_key!r}, has no "
                         f"{lacking} AL at k={k} (it has: {curve.describe_points()}); selected by model, a "
                         "missing thinking mode is an error as in InferenceX: pass --thinking with the mode it has")
    return SpecExpectation(k, send, on, off, curve.name, thinking)


def server_card(info_raw: dict[str, Any]) -> dict[str, Any] | None:
    """Our /v1/models `speculative` extension, when the entry has a well-formed one."""
    card = info_raw.get("speculative")
    if isinstance(card, dict) and isinstance(card.get("num_speculative_tokens"), int):
        return card
    return None


def server_default(card: dict[str, Any] | None) -> SpecExpectation | None:
    """What a speculating server of ours gives every request: its own default AL, never sent."""
    if card is None:
        return None
    al = card.get("synthetic_acceptance_length")
    return SpecExpectation(card["num_speculative_tokens"], False, al, al, "server default", "server")


@dataclass(slots=True)
class SpecTally:
    """One level's AL bookkeeping over its measured requests."""

    expected_weighted: float = 0.0  # sum of AL asked for * output tokens
    expected_tokens: int = 0
    usage_requests: int = 0
    num_drafts: int = 0
    num_accepted_tokens: int = 0
    scraped: list[SpecCounters | None] = field(default_factory=list)  # at window start, after the drain

    def add(self, expected_al: float | None, output_tokens: int, usage: SpecCounters | None) -> None:
        if expected_al is not None:
            self.expected_weighted += expected_al * output_tokens
            self.expected_tokens += output_tokens
        if usage is not None:
            self.usage_requests += 1
            self.num_drafts += usage.num_drafts
            self.num_accepted_tokens += usage.num_accepted_tokens

    def merge(self, other: SpecTally) -> None:
        """Add another worker's tally: the counts add; `scraped` holds server-wide counters, which
        one worker scrapes for all, so a non-empty one is taken as it is."""
        for spec_field in fields(self):
            name = spec_field.name
            if name == "scraped":
                if other.scraped:
                    self.scraped = list(other.scraped)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self, expectation: SpecExpectation | None) -> dict[str, Any] | None:
        drafts, accepted = self.num_drafts, self.num_accepted_tokens
        source: str | None = "usage"
        if not self.usage_requests:
            source = None
            start, end = self.scraped if len(self.scraped) == 2 else (None, None)
            if start is not None and end is not None:
                drafts = end.num_drafts - start.num_drafts
                accepted = end.num_accepted_tokens - start.num_accepted_tokens
                source = "metrics" if drafts > 0 else None
        if expectation is None and source is None:
            return None
        return {
            "k": expectation.k if expectation else None,
            "golden_al": expectation.source if expectation else None,
            "expected_al": round(self.expected_weighted / self.expected_tokens, 4) if self.expected_tokens else None,
            "measured_al": round((drafts + accepted) / drafts, 4) if source and drafts else None,
            "measured_from": source,
            "num_drafts": drafts if source else None,
            "num_accepted_tokens": accepted if source else None,
            "requests_with_usage": self.usage_requests,
        }


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The two counters out of Prometheus text (summed over label sets); None if either is absent."""
    totals = metric_totals(text, (METRIC_DRAFTS, METRIC_ACCEPTED))
    return None if totals is None else spec_counters_of(totals)
