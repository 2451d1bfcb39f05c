"""Speculative decoding's configuration: vLLM's --speculative-config, optionally with its
acceptance length taken from a golden curve (--golden-al, --thinking)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from golden_al import CurveError, load_curve, min_variance_rates, validate_rates
from golden_al.pins import THINKING_MODES
from golden_al.schedules import check_al
from server.config.flags import cli, require

SPEC_METHODS = ("mtp", "dspark")  # one mechanism: a one-layer draft head on the target's hidden state
REJECTION_SAMPLE_METHODS = ("synthetic", "standard")
_SPEC_KEYS = ("method", "num_speculative_tokens", "rejection_sample_method",
              "synthetic_acceptance_length", "synthetic_acceptance_rates")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's --speculative-config. `synthetic` acceptance draws each step's accepted-draft count
    from a per-position rate schedule (given as a mean AL, turned into vLLM's min-variance
    schedule, or as unconditional rates); `standard` verifies the drafts against the target."""

    method: str
    num_speculative_tokens: int  # k
    rejection_sample_method: str = "standard"
    synthetic_acceptance_length: float | None = None
    synthetic_acceptance_rates: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        validate_speculative_config(self)

    @property
    def synthetic(self) -> bool:
        return self.rejection_sample_method == "synthetic"

    @property
    def acceptance_rates(self) -> tuple[float, ...]:
        """Unconditional per-position rates of the synthetic schedule (empty for `standard`)."""
        if not self.synthetic:
            return ()
        if self.synthetic_acceptance_rates is not None:
            return self.synthetic_acceptance_rates
        assert self.synthetic_acceptance_length is not None  # validated: synthetic gives one of the two
        return tuple(min_variance_rates(self.synthetic_acceptance_length, self.num_speculative_tokens))


def validate_speculative_config(s: SpeculativeConfig) -> None:
    flag = "--speculative-config"
    require(s.method in SPEC_METHODS, f"{flag}: method must be one of {', '.join(SPEC_METHODS)}, got {s.method!r}")
    k = s.num_speculative_tokens
    require(isinstance(k, int) and not isinstance(k, bool) and k >= 1,
            f"{flag}: num_speculative_tokens must be an integer >= 1, got {k!r}")
    require(s.rejection_sample_method in REJECTION_SAMPLE_METHODS,
            f"{flag}: rejection_sample_method must be one of {', '.join(REJECTION_SAMPLE_METHODS)}, "
            f"got {s.rejection_sample_method!r}")
    al, rates = s.synthetic_acceptance_length, s.synthetic_acceptance_rates
    if not s.synthetic:
        require(al is None and rates is None,
                f"{flag}: synthetic_acceptance_length/rates need rejection_sample_method 'synthetic'")
        return
    require(al is None or rates is None,
            f"{flag}: give exactly one of synthetic_acceptance_length and synthetic_acceptance_rates, not both")
    require(al is not None or rates is not None,
            f"{flag}: rejection_sample_method 'synthetic' needs synthetic_acceptance_length or "
            f"synthetic_acceptance_rates (or --golden-al)")
    try:
        if al is not None:
            require(isinstance(al, (int, float)) and not isinstance(al, bool),
                    f"synthetic_acceptance_length must be a number, got {al!r}")
            check_al(float(al), k)
        elif rates is not None:
            validate_rates(rates, k)
    except CurveError as exc:
        key = "synthetic_acceptance_length" if al is not None else "synthetic_acceptance_rates"
        raise ValueError(f"{flag}: {key}: {exc}") from None


def speculative_config_from_flags(text: str | None, golden_al: str | None,
                                  thinking: str | None) -> SpeculativeConfig | None:
    """--speculative-config JSON, optionally with the AL taken from a golden curve at its k."""
    if text is None:
        require(golden_al is None, "--golden-al: needs --speculative-config with method and num_speculative_tokens")
        require(thinking is None, "--thinking: only meaningful with --golden-al")
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config: not valid JSON: {exc}") from None
    require(isinstance(obj, dict), "--speculative-config: must be a JSON object")
    unknown = sorted(set(obj) - set(_SPEC_KEYS))
    require(not unknown, f"--speculative-config: unknown key(s) {unknown}; known: {', '.join(_SPEC_KEYS)}")
    for key in ("method", "num_speculative_tokens"):
        require(key in obj, f"--speculative-config: missing {key!r}")
    rates = obj.get("synthetic_acceptance_rates")
    if rates is not None:
        require(isinstance(rates, list) and all(isinstance(r, (int, float)) and not isinstance(r, bool)
                                                for r in rates),
                f"--speculative-config: synthetic_acceptance_rates must be a list of numbers, got {rates!r}")
        rates = tuple(float(r) for r in rates)
    al = obj.get("synthetic_acceptance_length")
    synthetic_given = al is not None or rates is not None
    if golden_al is not None:
        require(not synthetic_given, "--golden-al: the curve gives the acceptance length; drop "
                                     "synthetic_acceptance_length/rates from --speculative-config")
        require(obj.get("rejection_sample_method", "synthetic") == "synthetic",
                "--golden-al: needs rejection_sample_method 'synthetic'")
        k = obj["num_speculative_tokens"]
        require(isinstance(k, int) and not isinstance(k, bool) and k >= 1,
                f"--speculative-config: num_speculative_tokens must be an integer >= 1, got {k!r}")
        try:
            al = load_curve(golden_al).al(k, (thinking or "on") == "on")
        except CurveError as exc:
            raise ValueError(f"--golden-al: {exc}") from None
        synthetic_given = True
    else:
        require(thinking is None, "--thinking: only meaningful with --golden-al")
    return SpeculativeConfig(
        method=obj["method"], num_speculative_tokens=obj["num_speculative_tokens"],
        rejection_sample_method=obj.get("rejection_sample_method", "synthetic" if synthetic_given else "standard"),
        synthetic_acceptance_length=al, synthetic_acceptance_rates=rates,
    )


_SPEC_GROUP = "speculative decoding"


@dataclass(frozen=True, slots=True)
class SpeculativeFlags:
    """The command line's speculative-decoding flags, turned into a SpeculativeConfig by `build`."""

    speculative_config: str | None = field(default=None, metadata=cli(
        "--speculative-config", metavar="JSON", group=_SPEC_GROUP, default_text="off",
        help="vLLM's speculative config, e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 5, "
             "\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_length\": 3.51}'. "
             "method: mtp or dspark (the same mechanism here: a one-layer draft head on the target's "
             "last hidden state); rejection_sample_method: synthetic (needs exactly one of "
             "synthetic_acceptance_length or synthetic_acceptance_rates, per-position unconditional, "
             "non-increasing, length k) or standard (greedy / rejection-sampling verification)"))
    golden_al: str | None = field(default=None, metadata=cli(
        "--golden-al", metavar="NAME|FILE", group=_SPEC_GROUP,
        help="take the synthetic acceptance length at num_speculative_tokens from this golden curve "
             "(bundled name, see `loadgen golden-al list`, or a YAML file)"))
    thinking: str | None = field(default=None, metadata=cli(
        "--thinking", choices=THINKING_MODES, group=_SPEC_GROUP, default_text="on",
        help="with --golden-al: the curve's thinking_on or thinking_off AL"))

    def build(self) -> SpeculativeConfig | None:
        return speculative_config_from_flags(self.speculative_config, self.golden_al, self.thinking)

