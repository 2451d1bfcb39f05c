"""Whether a run meets InferenceX AgentX's submission rules: `check_validity` judges a results
document (config + levels, as loadgen/run/replay.py writes it) and names each rule that failed;
`submission_flags` gives the replay flag values that make a run meet them.

The numbers are upstream's unless marked "ours": InferenceX runs AgentX through aiperf's
`inferencex-agentx-mvp` scenario (read at InferenceX 843c6254f and aiperf 211ad67f; the names
below are upstream's settings).

- run_complete: the run ended "complete"; aiperf marks a cancelled run invalid (run_cancelled).
- mid_trace_start: a closed loop (the scenario's agentic_replay timing, concurrency in session
  trees) whose lanes start inside their sessions (--start-offset HI > 0). The submission's
  0.25:0.75 is InferenceX's trajectory start ratio range.
- cache_priming_warmup: a warm-up counted in requests, at least 1 per lane, so the window opens
  only after every lane has re-sent the context at its start offset (the scenario's primer).
  The submission's 10 per lane is InferenceX's AIPERF_WARMUP_REQUESTS_PER_LANE; there they are
  one-token requests after the primer, here full turns counting the primer.
- think_time_cap: think times capped at <= 300 s, InferenceX's AIPERF_TRACE_IDLE_GAP_CAP_SECONDS.
  Upstream caps the end-to-start idle time of a whole trajectory tree; loadgen caps every think
  time and subagent gap, which is at least as tight.
- system_idle_gap: the server never idles > 10 s (the scenario's system_idle_gap_cap_seconds).
  aiperf moves pending requests earlier when nothing is in flight; loadgen does not, so the gap
  is measured: the longest stretch between a level's counted requests with none in flight (its
  request columns). Failed requests are not in the columns, so a gap can only be overstated,
  and only where requests failed.
- recorded_think_times: --think-time-scale 1, the scenario keeps the recorded delays
  (forbid_ignore_trace_delays).
- unscaled_tokens: --token-scale 1. Ours, from the scenario's exact-corpus and no-truncation
  locks: scaled token counts replay another workload.
- over_context: at most 1 % of the trace's requests dropped or trimmed for the context limit
  (aiperf's AIPERF_AGENTX_CONTEXT_OVERFLOW_RATE_LIMIT 0.01, equal accepted). Upstream counts the
  server's context-overflow answers; loadgen never sends such a request, so the trace scale
  report's dropped + trimmed stand in for them.
- error_rate: at most 10 % of a level's window requests failed, equal accepted (InferenceX's
  AIPERF_FAILED_REQUEST_THRESHOLD and its agentic result validation).
- warmup_failures: no warm-up request failed; aiperf aborts the run on the first terminal
  warm-up failure.
- window_duration: every level's window >= 900 s (the scenario's min_benchmark_duration_seconds).
  The submission's 3600 s is InferenceX's DEFAULT_AGENTIC_DURATION_SECONDS.
- successful_requests: >= 1 per level (InferenceX's validation rejects zero completed requests;
  its ingest drops a row without a successful one). Upstream has no larger minimum, so neither
  do we.

Per-level rules report the worst level. A rule whose input the document lacks (a results file
from an older loadgen) is not checkable (`ok: None`), which makes the run invalid. What AgentX
also locks and loadgen always does needs no rule: ignore_eos with min_tokens, streaming, and a
fresh prompt salt per session play (the scenario's first_turn_prefix cache bust).

Kept free of heavy imports: loadgen/cli/replay.py reads `submission_flags` while building its parser.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.run.presets import flag_text

RULES_SOURCE = ("InferenceX AgentX (SemiAnalysisAI/InferenceX 843c6254f: its benchmark library and agentic result "
                "validation) and aiperf's inferencex-agentx-mvp scenario (SemiAnalysisAI/aiperf 211ad67f)")
UNSCALED = 1.0  # --token-scale / --think-time-scale that replay the trace as recorded


@dataclass(frozen=True)
class SubmissionRules:
    """Each AgentX limit once (sources: module docstring); the submission preset is built from it."""

    start_offset: tuple[float, float] = (0.25, 0.75)  # the preset's; the rule asks HI > 0
    warmup_requests: int = 10  # per lane, the preset's
    min_warmup_requests: int = 1  # per lane: the re-sent start context
    think_time_cap_s: float = 300.0
    system_idle_gap_s: float = 10.0
    max_over_context_share: float = 0.01
    max_error_rate: float = 0.10
    max_warmup_errors: int = 0
    min_window_s: float = 900.0
    duration_s: float = 3600.0  # the preset's window
    min_requests_ok: int = 1


SUBMISSION = SubmissionRules()


class _Missing(Exception):
    """A rule's input is not in the results document; the message is its path."""


Measure = Callable[[dict[str, Any], SubmissionRules], tuple[bool, Any, str]]


@dataclass(frozen=True)
class _Rule:
    name: str
    limit: Callable[[SubmissionRules], Any]
    measure: Measure  # (ok, value, one-sentence detail); raises _Missing


def check_validity(doc: dict[str, Any], rules: SubmissionRules = SUBMISSION) -> dict[str, Any]:
    """The `validity` block of a results document: valid only when every rule passed."""
    results = [_judge(rule, doc, rules) for rule in _RULES]
    failed = [result["rule"] for result in results if not result["ok"]]
    return {"valid": not failed, "failed": failed, "rules": results, "rules_source": RULES_SOURCE}


def submission_flags(rules: SubmissionRules = SUBMISSION) -> dict[str, str | float]:
    """Replay flag values (argparse dest -> value, typed as argparse gives them) that meet `rules`."""
    low, high = rules.start_offset
    return {
        "warmup": f"{rules.warmup_requests}req",
        "start_offset": f"{low:g}:{high:g}",
        "think_time_cap": rules.think_time_cap_s,
        "think_time_scale": UNSCALED,
        "token_scale": UNSCALED,
        "over_context": "drop",  # never a trimmed prompt: AgentX forbids client-side truncation
        "duration": rules.duration_s,
        "max_error_rate": rules.max_error_rate,
    }


def describe_validity(validity: dict[str, Any]) -> str:
    """One line: valid, or the rules broken with their details."""
    if validity["valid"]:
        return "AgentX validity: valid (every submission rule met)"
    broken = [rule for rule in validity["rules"] if rule["ok"] is not True]
    shown = "; ".join(f"{rule['rule']} ({rule['detail']})" for rule in broken[:3])
    more = f"; and {len(broken) - 3} more" if len(broken) > 3 else ""
    return f"AgentX validity: not a valid submission: {shown}{more} (`--submission` sets what a run can)"


def apply_submission(args: Any, defaults: dict[str, Any]) -> str:
    """Set the submission's flag values on `args` where the user left the flag at its default
    (`defaults`); returns the flags set, as typed."""
    chosen = {dest: value for dest, value in submission_flags().items() if getattr(args, dest) == defaults.get(dest)}
    for dest, value in chosen.items():
        setattr(args, dest, value)
    return flag_text(chosen)


def _judge(rule: _Rule, doc: dict[str, Any], rules: SubmissionRules) -> dict[str, Any]:
    try:
        ok, value, detail = rule.measure(doc, rules)
    except _Missing as missing:
        ok, value, detail = None, None, f"not checkable: the results have no {missing} (an older loadgen's file)"
    return {"rule": rule.name, "ok": ok, "value": value, "limit": rule.limit(rules), "detail": detail}


def _get(node: Any, *path: str) -> Any:
    """node[path[0]][path[1]]...; _Missing naming the path when a key is absent (None is a value)."""
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise _Missing(".".join(path))
        node = node[key]
    return node


# ---- run-wide rules ---------------------------------------------------------------------------


def _run_complete(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    status = _get(doc, "status")
    return status == "complete", status, f"the run ended {status!r}"


def _mid_trace_start(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    mode, offset = _get(doc, "config", "mode"), _get(doc, "config", "start_offset")
    value = {"mode": mode, "start_offset": offset}
    if mode != "closed":
        return False, value, f"{mode} loop: AgentX replays closed-loop session trees"
    ok = offset[1] > 0
    where = "inside their sessions" if ok else "at their sessions' first request"
    return ok, value, f"lanes start {where} (--start-offset {offset[0]:g}:{offset[1]:g})"


def _cache_priming_warmup(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    from loadgen.run.level import Warmup  # here, not at the top: loadgen.run.level imports the histograms

    text, mode = _get(doc, "config", "warmup"), _get(doc, "config", "mode")
    requests = Warmup.parse(text).requests or 0
    if mode != "closed" or requests < rules.min_warmup_requests:
        return False, text, (f"warm-up {text} does not wait for every lane to re-send its start context before "
                             "the window opens (a closed loop with --warmup Nreq does)")
    return True, text, f"the window opened after every lane had sent {requests} warm-up requests"


def _scale(doc: dict[str, Any], *key: str) -> Any:
    return _get(doc, "config", "traces", "scale", *key)


def _think_time_cap(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    cap = _scale(doc, "config", "think_time_cap")
    if cap is None:
        return False, None, "think times were not capped (--think-time-cap)"
    return cap <= rules.think_time_cap_s, cap, f"think times and subagent gaps capped at {cap:g} s"


def _recorded_think_times(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    scale = _scale(doc, "config", "think_time_scale")
    return scale == UNSCALED, scale, f"think times scaled by {scale:g} (--think-time-scale)"


def _unscaled_tokens(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    scale = _scale(doc, "config", "token_scale")
    return scale == UNSCALED, scale, f"token counts scaled by {scale:g} (--token-scale)"


def _over_context(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
    dropped, trimmed, requests = _scale(doc, "dropped"), _scale(doc, "trimmed"), _scale(doc, "requests")
    share = (dropped + trimmed) / requests if requests else 0.0
    detail = f"{dropped} dropped + {trimmed} trimmed of the trace's {requests} requests for the context limit"
    return share <= rules.max_over_context_share, round(share, 6), f"{detail} ({share:.2%})"


# ---- per-level rules: the worst level speaks for the run ----------------------------------------


def _level_rule(name: str, limit_field: str, value_of: Callable[[dict[str, Any]], float], worst: Callable,
                describe: str) -> _Rule:
    """A rule over the levels: the `worst` (max: an upper limit, min: a lower one) of `value_of`
    against the limit `limit_field` of SubmissionRules; `describe` formats the worst value."""

    def limit(rules: SubmissionRules) -> Any:
        return getattr(rules, limit_field)

    def measure(doc: dict[str, Any], rules: SubmissionRules) -> tuple[bool, Any, str]:
        levels = _get(doc, "levels")
        if not levels:
            raise _Missing("levels (none was measured)")
        value, label = worst(_level_values(levels, value_of), key=lambda pair: pair[0])
        ok = value <= limit(rules) if worst is max else value >= limit(rules)
        return ok, value, f"worst level {label}: {describe.format(value)}"

    return _Rule(name, limit, measure)


def _level_values(levels: list[dict[str, Any]], value_of: Callable[[dict[str, Any]], float]) -> list[tuple]:
    pairs = []
    for i, level in enumerate(levels):
        try:
            value = value_of(level)
        except _Missing as missing:
            raise _Missing(f"levels[{i}].{missing}") from None
        repeat = f" (repeat {level['repeat']})" if level.get("repeat") else ""
        pairs.append((value, f"{level.get('label') or level.get('mode')}{repeat}"))
    return pairs


def _warmup_errors(level: dict[str, Any]) -> int:
    return sum(_get(level, "counts", "warmup_errors").values())


def _longest_idle_s(level: dict[str, Any]) -> float:
    """The longest stretch between the level's counted requests with none of them in flight."""
    columns = _get(level, "requests")
    spans = sorted(zip(_get(columns, "start_ms"), _get(columns, "e2el_us")))
    longest_ms, busy_until = 0.0, None
    for start_ms, e2el_us in spans:
        if busy_until is not None:
            longest_ms = max(longest_ms, start_ms - busy_until)
        end_ms = start_ms + (e2el_us or 0) / 1000
        busy_until = end_ms if busy_until is None else max(busy_until, end_ms)
    return round(longest_ms / 1000, 3)


_RULES = (
    _Rule("run_complete", lambda r: "complete", _run_complete),
    _Rule("mid_trace_start", lambda r: "closed loop, --start-offset HI > 0", _mid_trace_start),
    _Rule("cache_priming_warmup", lambda r: f">= {r.min_warmup_requests}req per lane", _cache_priming_warmup),
    _Rule("think_time_cap", lambda r: r.think_time_cap_s, _think_time_cap),
    _level_rule("system_idle_gap", "system_idle_gap_s", _longest_idle_s, max, "{:g} s without a request in flight"),
    _Rule("recorded_think_times", lambda r: UNSCALED, _recorded_think_times),
    _Rule("unscaled_tokens", lambda r: UNSCALED, _unscaled_tokens),
    _Rule("over_context", lambda r: r.max_over_context_share, _over_context),
    _level_rule("error_rate", "max_error_rate", lambda level: _get(level, "counts", "error_rate"), max,
                "{:.2%} of the window's requests failed"),
    _level_rule("warmup_failures", "max_warmup_errors", _warmup_errors, max, "{} warm-up requests failed"),
    _level_rule("window_duration", "min_window_s", lambda level: _get(level, "window_s"), min, "a {:g} s window"),
    _level_rule("successful_requests", "min_requests_ok", lambda level: _get(level, "counts", "requests_ok"), min,
                "{} requests succeeded in the window"),
)
