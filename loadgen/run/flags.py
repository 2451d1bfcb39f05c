"""A replay's flags, checked and resolved: the options every run needs (levels, SLOs, warm-up, start
offsets, workers), and, once the server has answered, what they resolve to against it - the bundled
sessions fitted to our server, the traces loaded and scaled to its context, the token vocabulary,
the expected acceptance length, and the sweep of levels. A bad value raises ValueError or
UsageError naming its flag."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from loadgen.capacity.config import DEFAULT_SLO, check_search_flags, search_config
from loadgen.defaults import DEFAULT_FOREIGN_VOCAB, DEFAULTS, OUR_VOCAB
from loadgen.errors import UsageError
from loadgen.results.file import check_writable
from loadgen.results.slo import DEFAULT_SLOS, Slo, SloError, check_target, parse_slos
from loadgen.run.level import LevelLoad, Warmup
from loadgen.run.presets import TRACE_FIELDS, WINDOW_FIELDS, flag_text, preset_flags, preset_for
from loadgen.run.spec_decode import SpecExpectation, expectation_from_flags, server_card, server_default
from loadgen.run.sweep import CapacitySweep, FixedSweep, Sweep
from loadgen.run.trace_cache import load_traces_cached
from loadgen.transport.base import ServerInfo
from traces import DEFAULT_SET, TraceError, TraceSet
from traces.scale import ScaleConfig, scale_traces


def check_flags(args: argparse.Namespace) -> dict[str, Any]:
    """What a run needs of its flags before it asks the server anything: the results folder (made
    sure to be writable), SLOs, levels, warm-up, start offsets and workers; ValueError naming the flag."""
    duration = DEFAULTS.duration_s if args.duration is None else args.duration  # None: capacity's, chosen later
    for flag, value in (("--duration", duration), ("--timeout", args.timeout),
                        ("--warmup-timeout", warmup_timeout(args))):
        if not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value:g}")
    if not getattr(args, "server_metrics_interval", 0) >= 0:
        raise ValueError(f"--server-metrics-interval: must be >= 0 (0: off), got {args.server_metrics_interval:g}")
    if not 0 <= args.max_error_rate <= 1:
        raise ValueError(f"--max-error-rate: must be within 0..1, got {args.max_error_rate:g}")
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus: must be >= 1, got {args.gpus}")
    if getattr(args, "repeat", DEFAULTS.repeat) < 1:
        raise ValueError(f"--repeat: must be >= 1, got {args.repeat}")
    if getattr(args, "capacity", False):
        check_search_flags(args)
    if args.vocab_size is not None and args.vocab_size < 2:
        raise ValueError(f"--vocab-size: must be >= 2, got {args.vocab_size}")
    if args.vocab_offset is not None and args.vocab_offset < 0:
        raise ValueError(f"--vocab-offset: must be >= 0, got {args.vocab_offset}")
    out_dir = Path(args.out) if args.out else default_out_dir()
    check_writable(out_dir)  # before the run: its results must have somewhere to go
    if args.per_request:
        check_writable(Path(args.per_request).parent, "--per-request")
    return {
        "out_dir": out_dir,
        "slos": _slos(args),
        "conc": parse_list(getattr(args, "conc", DEFAULTS.conc), "--conc", int),
        "rates": parse_list(args.rate, "--rate", float) if getattr(args, "rate", None) else None,
        "warmup": Warmup.parse(args.warmup or DEFAULTS.warmup),
        "start_offset": parse_offset(args.start_offset),
        "workers": parse_workers(getattr(args, "workers", "1")),
    }


def scrape_interval(args: argparse.Namespace) -> float:
    """--server-metrics-interval (recipes' and tests' own namespaces may lack it: the default)."""
    return float(getattr(args, "server_metrics_interval", DEFAULTS.server_metrics_interval_s))


def _slos(args: argparse.Namespace) -> tuple[Slo, ...]:
    """--slo (default: every tier) and --attainment; ValueError naming the flag."""
    default = (DEFAULT_SLO,) if getattr(args, "capacity", False) else DEFAULT_SLOS
    try:
        check_target(getattr(args, "attainment", DEFAULTS.attainment))
        return parse_slos(getattr(args, "slo", None) or default)
    except SloError as exc:
        raise ValueError(str(exc) if str(exc).startswith("--") else f"--slo: {exc}") from None


def warmup_timeout(args: argparse.Namespace) -> float:
    """Callers that build their own namespace (recipes) may leave the newer flags out."""
    return getattr(args, "warmup_timeout", DEFAULTS.warmup_timeout_s)


def fit_bundled_sessions(args: argparse.Namespace, info: ServerInfo) -> list[str]:
    """Against our own server, the bundled sessions are fitted to the model it serves the way
    `loadgen bench` fits them (presets.py), for the flags the user did not give; the lines say
    what was chosen. Other servers and other traces are never rescaled behind the user's back."""
    chosen = {}
    bundled = args.traces in (None, DEFAULT_SET)
    if info.ours and bundled and hasattr(args, "workers"):  # `loadgen bench` applied its whole preset already
        model = info.raw.get("root") or info.model
        preset = preset_for(model)
        # a capacity search's probes are levels too: their window and warm-up as bench's levels
        fields = TRACE_FIELDS + (WINDOW_FIELDS if getattr(args, "capacity", False) else ())
        chosen = {name: value for name, value in preset_flags(preset, fields).items() if getattr(args, name) is None}
        for name, value in chosen.items():
            setattr(args, name, value)
    args.token_scale = 1.0 if args.token_scale is None else args.token_scale
    args.think_time_scale = 1.0 if args.think_time_scale is None else args.think_time_scale
    for name, default in (("duration", DEFAULTS.duration_s), ("warmup", DEFAULTS.warmup)):
        if getattr(args, name, default) is None:  # `loadgen capacity` leaves them to the preset, else these
            setattr(args, name, default)
    if not chosen:
        return []
    flags = flag_text(chosen)
    limit = f", max context {info.max_model_len}" if info.max_model_len else ""
    return [f"{args.command}: our server ({model}{limit}): the bundled sessions are scaled to it as "
            f"`loadgen bench` does: {flags}",
            f"{args.command}: give --token-scale / --think-time-scale / --think-time-cap to choose otherwise"]


def speculative_expectation(args: argparse.Namespace, info: ServerInfo) -> SpecExpectation | None:
    """replay: from --golden-al/--spec-k/--thinking; bench (no such flags: the engine's own
    --golden-al/--thinking set its AL): the engine's speculative config, never sent per request."""
    if not hasattr(args, "spec_k"):
        return server_default(server_card(info.raw))
    try:
        return expectation_from_flags(args.golden_al, args.spec_k, args.thinking, info.raw, info.ours)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def load_traces(args: argparse.Namespace, info: ServerInfo) -> tuple[TraceSet, Any]:
    # frozen: the set lives for the run (replay_with unfreezes), and the collector need not walk it
    traces = load_traces_cached(args.traces or DEFAULT_SET, args.trace_format, freeze=True)
    if traces.format == "mooncake" and len(traces.sessions) > 1:
        raise UsageError(f"--traces: a Mooncake replay takes one file (its timestamps are one timeline); "
                         f"{args.traces} holds {len(traces.sessions)}")
    max_context = args.max_context if args.max_context is not None else info.max_model_len
    scale = ScaleConfig(max_context=max_context, over_context=args.over_context, token_scale=args.token_scale,
                        think_time_scale=args.think_time_scale, think_time_cap=args.think_time_cap)
    try:
        return scale_traces(traces, scale)
    except TraceError as exc:
        if max_context is None:
            raise
        source = "--max-context" if args.max_context is not None else "the server's max_model_len"
        raise UsageError(f"{exc}: {source} is {max_context} tokens; shrink the trace with --token-scale "
                         f"(e.g. --token-scale 0.01) or raise the limit") from exc


def build_sweep(args: argparse.Namespace, options: dict[str, Any], traces: TraceSet) -> Sweep:
    """The levels to run: `loadgen capacity` (and `bench --capacity`) search them, else the flags list them."""
    if getattr(args, "capacity", False):
        return CapacitySweep(search_config(args, traces, options["slos"]))
    return FixedSweep(_level_loads(args, options, traces), getattr(args, "repeat", DEFAULTS.repeat))


def _level_loads(args: argparse.Namespace, options: dict[str, Any], traces: TraceSet) -> list[LevelLoad]:
    if options["rates"]:
        return [LevelLoad("poisson", rate=rate) for rate in options["rates"]]
    if traces.format == "mooncake":
        return [LevelLoad("mooncake")]
    return [LevelLoad("closed", concurrency=n) for n in options["conc"]]


def vocab(args: argparse.Namespace, info: ServerInfo) -> tuple[int, int]:
    offset, size = OUR_VOCAB if info.ours else DEFAULT_FOREIGN_VOCAB
    if args.vocab_offset is not None:
        offset = args.vocab_offset
    if args.vocab_size is not None:
        size = args.vocab_size
    elif info.vocab_size is not None and not info.ours:
        size = max(2, min(size, info.vocab_size - offset))
    if info.vocab_size is not None and offset + size > info.vocab_size:
        raise UsageError(f"--vocab-offset {offset} + --vocab-size {size} exceed the server's vocabulary "
                         f"({info.vocab_size} ids)")
    return offset, size


def parse_list(text: str, flag: str, kind: type) -> list:
    """'1,2,4' -> [1, 2, 4]; every item positive; ValueError naming the flag otherwise."""
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{flag}: expected positive numbers, got {text!r}")
    return values


def parse_offset(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--start-offset: expected LO:HI like 0.25:0.75, got {text!r}") from None
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"--start-offset: need 0 <= LO <= HI <= 1, got {text!r}")
    return low, high


def parse_headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"--header: expected K:V, got {item!r}")
        headers[key.strip()] = value.strip()
    return headers


def parse_workers(text: str) -> int | None:
    """'auto' -> None (sized to the load), else a positive count; ValueError naming --workers."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"--workers: expected a positive number of processes or 'auto', got {text!r}")
    return value


def default_out_dir() -> Path:
    """results/<UTC timestamp>/: one folder per run, sortable by time."""
    return Path("results") / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
