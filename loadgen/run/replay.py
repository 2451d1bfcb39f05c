"""One `loadgen replay` run: flags -> server info -> traces -> levels -> table and results file.

`replay_with` runs the same replay through any Transport (`loadgen bench` drives the engine
in-process with it); `replay_main` is the HTTP case.

Kept apart from cmd_replay.py so `loadgen --help` never imports numpy, hdrh or the traces.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from loadgen import __version__
from loadgen.capacity.config import DEFAULT_SLO, check_search_flags
from loadgen.capacity.sweep import CapacitySweep, describe_capacity, search_config, unheld_slo
from loadgen.errors import UsageError
from loadgen.report.table import format_level
from loadgen.results.file import SCHEMA, check_writable, save_results
from loadgen.results.pareto import pareto
from loadgen.results.slo import DEFAULT_SLOS, Slo, SloError, check_target, parse_slos
from loadgen.run import closed_loop, open_loop
from loadgen.run.affinity import format_cpus
from loadgen.run.event_loop import run_event_loop
from loadgen.run.level import LevelLoad, LevelRun, RunConfig, Share, Warmup
from loadgen.run.options import (
    DEFAULT_FOREIGN_VOCAB,
    DEFAULTS,
    OUR_VOCAB,
    parse_headers,
    parse_list,
    parse_offset,
    parse_workers,
)
from loadgen.run.plan import TimingConfig, max_subagents
from loadgen.run.presets import TRACE_FIELDS, WINDOW_FIELDS, flag_text, preset_flags, preset_for
from loadgen.run.progress import ProgressPrinter, describe
from loadgen.run.runner import Runner
from loadgen.run.spec_decode import SpecExpectation, expectation_from_flags, server_card, server_default
from loadgen.run.summary import TraceHitRates, dumps_record, level_summary
from loadgen.run.sweep import FixedSweep, Sweep
from loadgen.run.trace_cache import PackedTraces, load_traces_cached
from loadgen.run.validity import apply_submission, check_validity, describe_validity
from loadgen.run.workers import HttpTarget, LocalPool, Pool, ProcessPool, WorkerError, WorkerSetup, auto_workers
from loadgen.telemetry.gpu import GpuSampler, choose_source, gpu_block
from loadgen.telemetry.gpu_sources import NoGpuSource
from loadgen.telemetry.series import ServerSeries
from loadgen.transport.base import ServerInfo, Transport, TransportError
from loadgen.transport.http import HttpTransport
from traces import DEFAULT_SET, PromptSynth, TraceError, TraceSet
from traces.scale import ScaleConfig, scale_traces
from traces.stats import theoretical_hit_rate

OPEN_LOOP_CONNECTIONS = 4096
POLL_S = 0.2  # how often the parent looks at the level's progress (and at the workers' warm-up)


def replay_main(args: argparse.Namespace) -> int:
    try:
        url = urlsplit(args.url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"--url: expected http://HOST:PORT or https://HOST:PORT, got {args.url!r}")
        headers = parse_headers(args.header)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    target = HttpTarget(args.url, args.endpoint, args.model, args.api_key, headers, args.timeout)
    transport = HttpTransport(args.url, args.endpoint, args.model, args.api_key, headers, args.timeout)
    return replay_with(args, transport, {"url": args.url, "endpoint": args.endpoint}, http_target=target)


def replay_with(args: argparse.Namespace, transport: Transport, target: dict[str, Any],
                http_target: HttpTarget | None = None) -> int:
    """Replay through `transport`; `target` (what was driven, e.g. the URL) goes into the results
    config. With `http_target`, --workers/--ray may spread the load over worker processes, each
    with its own HTTP transport to that target."""
    if getattr(args, "submission", False):
        if getattr(args, "rate", None) or getattr(args, "capacity", False):
            raise UsageError("--submission: AgentX runs are closed loop at fixed concurrencies (--conc); drop "
                             "--rate (or use `loadgen replay`, not `capacity`)")
        flags = apply_submission(args, args.submission_defaults)
        if not args.quiet and flags:
            print(f"{args.command}: --submission: {flags}", flush=True)
    try:
        options = _check_flags(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    try:
        return run_event_loop(_replay(args, options, transport, target, http_target))
    finally:
        # The traces were loaded frozen and the run froze the heap. A caller's process goes on
        # (`bench`: frozen triton objects would outlive the final collection, and nanobind would
        # print leak warnings at exit).
        gc.unfreeze()


def _check_flags(args: argparse.Namespace) -> dict[str, Any]:
    duration = DEFAULTS.duration_s if args.duration is None else args.duration  # None: capacity's, chosen later
    for flag, value in (("--duration", duration), ("--timeout", args.timeout),
                        ("--warmup-timeout", _warmup_timeout(args))):
        if not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value:g}")
    if not getattr(args, "server_metrics_interval", 0) >= 0:
        raise ValueError(f"--server-metrics-interval: must be >= 0 (0: off), got {args.server_metrics_interval:g}")
    if not 0 <= args.max_error_rate <= 1:
        raise ValueError(f"--max-error-rate: must be within 0..1, got {args.max_error_rate:g}")
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus: must be >= 1, got {args.gpus}")
    if getattr(args, "repeat", 1) < 1:
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
        "conc": parse_list(getattr(args, "conc", "1"), "--conc", int),
        "rates": parse_list(args.rate, "--rate", float) if getattr(args, "rate", None) else None,
        "warmup": Warmup.parse(args.warmup or DEFAULTS.warmup),
        "start_offset": parse_offset(args.start_offset),
        "workers": parse_workers(getattr(args, "workers", "1")),
    }


def _scrape_interval(args: argparse.Namespace) -> float:
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


def _warmup_timeout(args: argparse.Namespace) -> float:
    """Callers that build their own namespace (recipes) may leave the newer flags out."""
    return getattr(args, "warmup_timeout", DEFAULTS.warmup_timeout_s)


async def _replay(args: argparse.Namespace, options: dict[str, Any], transport: Transport,
                  target: dict[str, Any], http_target: HttpTarget | None) -> int:
    printer = ProgressPrinter(DEFAULTS.piped_progress_interval_s, enabled=not args.quiet)
    await transport.open(max_connections=64)
    try:
        info = await transport.server_info()
    except TransportError as exc:
        await transport.close()
        hint = (f" (--url defaults to {DEFAULTS.url}, where `server start` listens: start the server, or "
                "give --url)") if getattr(args, "url", None) == DEFAULTS.url else ""
        print(f"loadgen {args.command}: error: {exc}{hint}", file=sys.stderr)
        return 1
    await transport.close()

    expectation = _spec_expectation(args, info)
    for line in _fit_bundled_sessions(args, info):
        printer.say(line)
    options["warmup"] = Warmup.parse(args.warmup)  # the preset's, when the search took it
    traces, scale_report = _load_traces(args, info)
    sweep = _sweep(args, options, traces)
    levels = sweep.sizing()
    config = RunConfig(
        duration_s=args.duration, warmup=options["warmup"],
        timing=TimingConfig(args.think_time_scale, args.think_time_cap),
        seed=args.seed, start_offset=options["start_offset"], time_scale=args.time_scale,
        timeout_s=args.timeout, max_error_rate=args.max_error_rate,
        gpus=args.gpus or info.num_gpus or 1, warmup_timeout_s=_warmup_timeout(args),
        slos=options["slos"], slo_target=getattr(args, "attainment", DEFAULTS.attainment), live_slo=sweep.live_slo,
    )
    vocab_offset, vocab_size = _vocab(args, info)
    planned_path = results_path = options["out_dir"] / "result.json"
    workers = _worker_count(args, options, levels, traces, http_target)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "created": _utc_now(), "status": "complete", "message": None,
        "config": {**_config(args, target, config, info, traces, scale_report, levels, vocab_offset, vocab_size),
                   "spec_decode": expectation.describe() if expectation else None},
        "levels": [], "pareto": None,
    }
    per_request = _open_per_request(args.per_request)
    write_records = _record_writer(per_request)
    if http_target is not None and (workers > 1 or getattr(args, "ray", None)):
        packed = PackedTraces.of(traces)
        setups = [WorkerSetup(http_target, packed, (vocab_offset, vocab_size), config,
                              expectation.describe() if expectation else None, Share(i, workers),
                              _pool_size(levels, traces, workers), per_request is not None)
                  for i in range(workers)]
        pool: Pool = _ray_pool(args.ray, setups, write_records) if getattr(args, "ray", None) \
            else ProcessPool(setups, write_records)
        where = f"Ray actors ({args.ray})" if getattr(args, "ray", None) else "processes"
        printer.say(f"client: {workers} worker {where}")
    else:
        synth = PromptSynth(traces.block_size, vocab_size=vocab_size, vocab_offset=vocab_offset)
        on_request = None if write_records is None else (lambda rec: write_records(dumps_record(rec)))
        pool = LocalPool(Runner(transport, traces, synth, config, spec=expectation, on_request=on_request))
    # blocking: it loads NVML or amdsmi, or asks the server's /metrics
    gpu = GpuSampler(await asyncio.to_thread(choose_source, getattr(args, "gpu_telemetry", DEFAULTS.gpu_telemetry),
                                             getattr(args, "url", None)), DEFAULTS.gpu_interval_s)
    if not isinstance(gpu.source, NoGpuSource):  # none: each level's table line says so, and why
        printer.say(f"GPU telemetry: {gpu.source.describe()}")
    doc["config"]["gpu_telemetry"] = gpu.source.describe()
    hit_rates = TraceHitRates(traces, theoretical_hit_rate)
    session_turns = {session.id: len(session.requests) for session in traces.sessions}
    loop = asyncio.get_running_loop()
    # The traces are many long-lived objects: keep the cyclic GC from walking them during the run.
    # No full collection first: it costs tens of milliseconds before the first request and
    # would free only the little garbage of the start-up.
    gc.freeze()
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, pool.interrupt)
        if isinstance(pool, LocalPool):
            await transport.open(max_connections=_pool_size(levels, traces, 1))
        else:
            await _start_workers(pool, printer)
            await transport.open(max_connections=2)  # the parent's own: /metrics
        gpu.start()
        # a level's repeats share its index, so they replay the same plan (loadgen/run/runner.py)
        while not pool.stopped and (step := sweep.next_level()) is not None:
            of = f" (repeat {step.repeat + 1} of {step.repeats})" if step.repeats > 1 else ""
            printer.say(f"-- {step.spec.label}{of}: {_level_plan(step.spec, step.index, traces, config)}")
            series = ServerSeries(transport.metrics_text, interval) if (interval := _scrape_interval(args)) else None
            level_started = time.perf_counter_ns()
            try:
                level, early, window_start = await _drive_level(pool, step.spec, step.index, config, printer, sweep,
                                                                series)
            except WorkerError as exc:
                pool.status, pool.message = "failed", f"a client worker failed: {exc}"
                break
            printer.clear()
            # without an HTTP target the transport is bench's engine, in this process
            summary = level_summary(level, config, hit_rates.of(level), expectation,
                                    engine_in_process=http_target is None, session_turns=session_turns)
            summary["repeat"] = step.repeat
            summary["stopped_early"] = early
            await asyncio.to_thread(gpu.sample)  # one reading after the drain: the window's end is covered
            summary["gpu"] = gpu_block(gpu, level_started, window_start, summary)
            if series is not None:
                summary["server_metrics"] = series.summary(window_start, summary["window_s"])
                summary["cache"]["server_hit_rate"] = summary["server_metrics"]["window"]["prefix_cache_hit_rate"]
            doc["levels"].append(summary)
            if not pool.stopped:
                sweep.observe(summary)
                doc.update(sweep.results(config.gpus))
            results_path = _finish(doc, pool, results_path, running=True)
            printer.say(_level_report(summary, level, pool))
            if early:
                printer.say(f"   window ended early: {early}")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        printer.clear()
        await asyncio.to_thread(gpu.stop)
        await pool.close()
        await transport.close()
        if per_request:
            try:
                per_request.close()
            except OSError as exc:  # its last lines could not be flushed (a full disk): the run says so
                pool.status, pool.message = "failed", f"--per-request {args.per_request}: {exc.strerror or exc}"
        results_path = _finish(doc, pool, results_path)
    if "capacity" in doc:
        printer.say(describe_capacity(doc["capacity"]))
    printer.say(describe_validity(doc["validity"]))
    printer.say(f"results: {results_path}")
    return _exit_code(doc, pool, args.command) or int(results_path != planned_path)


async def _start_workers(pool: Pool, printer: ProgressPrinter) -> None:
    started = time.monotonic()
    task = asyncio.ensure_future(pool.start())
    while not task.done():
        await asyncio.wait({task}, timeout=POLL_S)
        printer.show(f"starting {pool.workers} client workers: {time.monotonic() - started:.0f} s")
    printer.clear()
    try:
        task.result()
    except WorkerError as exc:
        pool.status, pool.message = "failed", f"the client workers did not start: {exc}"


async def _drive_level(pool: Pool, spec: LevelLoad, index: int, config: RunConfig, printer: ProgressPrinter,
                       sweep: Sweep, series: ServerSeries | None
                       ) -> tuple[LevelRun, str | None, int | None]:
    """Run one level on the pool, showing its progress; with several workers and a warm-up that
    counts requests, open the window once every worker's lanes are warm. The sweep may end the
    window early (a decided capacity probe). `series` scrapes the server's /metrics meanwhile, and
    once more after the drain. Returns the level, why it was ended early, and when (perf_counter
    ns, from the progress snapshots: the workers keep their own clocks' stamps) its window opened."""
    task = asyncio.ensure_future(pool.run_level(spec, index))
    scraper = asyncio.ensure_future(series.run()) if series is not None else None
    started = time.monotonic()
    coordinate = pool.workers > 1 and spec.mode == "closed" and bool(config.warmup.requests)
    opener = asyncio.ensure_future(pool.open_window_when_warm()) if coordinate else None
    early, window_start = None, None
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                if scraper is not None and series is not None:
                    scraper.cancel()
                    await asyncio.gather(scraper, return_exceptions=True)
                    await series.scrape()  # after the drain: the window's requests are all counted
                return task.result(), early, window_start
            snap = await pool.snapshot()
            if window_start is None and snap.get("window_open"):
                window_start = time.perf_counter_ns() - int(snap["window_elapsed_s"] * 1e9)
            if early is None and (early := sweep.early_stop(snap, config.duration_s)) is not None:
                await pool.end_window()
            printer.show(describe(spec.label, snap, time.monotonic() - started, config.duration_s,
                                  config.warmup_timeout_s, config.timeout_s))
    finally:
        for side in (opener, scraper):
            if side is not None and not side.done():
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)
        if not task.done():
            task.cancel()


def _level_plan(spec: LevelLoad, index: int, traces: TraceSet, config: RunConfig) -> str:
    """What a level will do, before it starts: so a slow server can be told from a hung one."""
    warm = config.warmup
    if spec.mode == "closed":
        plays = closed_loop.plays_of(traces, config, index, spec.lanes)
        sessions, tokens = closed_loop.warmup_plan(plays, spec.lanes, warm.requests)
        what = f"{_plural(spec.lanes, 'lane')} over {_plural(sessions, 'session')}"
        warmup = (f"warm-up {warm.describe()} per lane" if warm.requests else
                  f"warm-up {warm.describe()}")
        warmup += f" (each lane first re-sends its start context: {tokens:,} prompt tokens"
        warmup += " in the warm-up requests)" if warm.requests else ")"
    else:
        tokens = open_loop.warmup_prompt_tokens(traces, config, spec, index)
        what = f"Poisson arrivals at {spec.rate:g}/s" if spec.mode == "poisson" else "recorded arrivals"
        warmup = f"warm-up {warm.describe()}" + (f" ({tokens:,} prompt tokens)" if warm.requests else "")
    return f"{what}, {warmup}, window {config.duration_s:g} s"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _level_report(summary: dict[str, Any], level: LevelRun, pool: Pool) -> str:
    if level.window_start_ns is None or (summary["window_s"] == 0 and not summary["counts"]["requests_ok"]):
        done = summary["counts"]["warmup_requests_ok"]
        why = {"interrupted": "interrupted", "server_dead": "the server went away", "failed": "stopped"}.get(
            pool.status, "stopped")
        return (f"== {summary['label']}: {why} during the warm-up ({done} warm-up requests done): "
                "nothing measured")
    return format_level(summary)


def default_out_dir() -> Path:
    """results/<UTC timestamp>/: one folder per run, sortable by time."""
    return Path("results") / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _finish(doc: dict[str, Any], pool: Pool, path: Path, running: bool = False) -> Path:
    """Write the results as they stand; returns where they went (a temporary file if `path` failed).
    While the run goes on (`running`) the file says it was interrupted: a process killed before its
    last write (kill -9, out of memory) must not leave a file that a reader (`recipe run --resume`)
    takes for a whole run."""
    doc["status"], doc["message"] = pool.status, pool.message
    if running and pool.status == "complete":
        doc["status"], doc["message"] = "interrupted", "the run was still going when this was written"
    doc["pareto"] = pareto(doc["levels"])
    doc["validity"] = check_validity(doc)  # AgentX's submission rules (loadgen/run/validity.py)
    return save_results(path, doc)


def _exit_code(doc: dict[str, Any], pool: Pool, command: str) -> int:
    if pool.status == "interrupted":
        print(f"loadgen {command}: interrupted; results of what ran are written", file=sys.stderr)
        return 130
    if pool.status in ("server_dead", "failed"):
        print(f"loadgen {command}: error: {pool.message}", file=sys.stderr)
        return 1
    failed = [level["label"] for level in doc["levels"] if level["failed"]]
    if failed:
        print(f"loadgen {command}: failed levels: {', '.join(failed)}", file=sys.stderr)
        return 1
    if (found := doc.get("capacity")) and found["below_range"]:
        print(f"loadgen {command}: error: {unheld_slo(found, doc['levels'])}", file=sys.stderr)
        return 1
    return 0


def _fit_bundled_sessions(args: argparse.Namespace, info: ServerInfo) -> list[str]:
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


def _worker_count(args: argparse.Namespace, options: dict[str, Any], levels: list[LevelLoad], traces: TraceSet,
                  http_target: HttpTarget | None) -> int:
    ray = getattr(args, "ray", None)
    if http_target is None:
        if options["workers"] not in (None, 1) or ray:
            raise UsageError(f"--workers/--ray: `loadgen {args.command}` drives one in-process engine; "
                             "worker processes need an HTTP server (`loadgen replay`)")
        return 1
    if options["workers"] is not None:
        return options["workers"]
    requests = [r for s in traces.sessions for r in s.all_requests()]
    mean_osl = sum(r.output_tokens for r in requests) / max(1, len(requests))
    return auto_workers(levels, mean_osl, cpus=(1 << 16) if ray else None)


def _ray_pool(address: str, setups: list[WorkerSetup], on_records) -> Pool:
    try:
        from loadgen.run.ray_pool import RayPool
    except ImportError as exc:
        raise UsageError(f"--ray: Ray is not installed ({exc}); install it with `pip install agentload[ray]`") from exc
    return RayPool(address, setups, on_records)


def _spec_expectation(args: argparse.Namespace, info: ServerInfo) -> SpecExpectation | None:
    """replay: from --golden-al/--spec-k/--thinking; bench (no such flags: the engine's own
    --golden-al/--thinking set its AL): the engine's speculative config, never sent per request."""
    if not hasattr(args, "spec_k"):
        return server_default(server_card(info.raw))
    try:
        return expectation_from_flags(args.golden_al, args.spec_k, args.thinking, info.raw, info.ours)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _load_traces(args: argparse.Namespace, info: ServerInfo) -> tuple[TraceSet, Any]:
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


def _sweep(args: argparse.Namespace, options: dict[str, Any], traces: TraceSet) -> Sweep:
    """The levels to run: `loadgen capacity` (and `bench --capacity`) search them, else the flags list them."""
    if getattr(args, "capacity", False):
        return CapacitySweep(search_config(args, traces, options["slos"]))
    return FixedSweep(_level_specs(args, options, traces), getattr(args, "repeat", 1))


def _level_specs(args: argparse.Namespace, options: dict[str, Any], traces: TraceSet) -> list[LevelLoad]:
    if options["rates"]:
        return [LevelLoad("poisson", rate=rate) for rate in options["rates"]]
    if traces.format == "mooncake":
        return [LevelLoad("mooncake")]
    return [LevelLoad("closed", concurrency=n) for n in options["conc"]]


def _vocab(args: argparse.Namespace, info: ServerInfo) -> tuple[int, int]:
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


def _pool_size(levels: list[LevelLoad], traces: TraceSet, workers: int) -> int:
    """Connections per worker: every request the heaviest level can have in flight at once."""
    if levels[0].mode != "closed":
        return math.ceil(OPEN_LOOP_CONNECTIONS / workers)
    lanes = math.ceil(max(spec.lanes for spec in levels) / workers)
    return lanes * (1 + max_subagents(traces.sessions))


def _client_cpus() -> str | None:
    """The CPUs the client may run on ("0-3"; `taskset` or a recipe's sweep.client_cpus narrow it)."""
    return format_cpus(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _config(args, target: dict[str, Any], config: RunConfig, info: ServerInfo, traces: TraceSet, scale_report,
            levels: list[LevelLoad], vocab_offset: int, vocab_size: int) -> dict[str, Any]:
    return {
        "command_line": _redacted([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "loadgen_version": __version__,
        "git_revision": _git_revision(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "machine": platform.machine(), "cpu_model": _cpu_model(), "python": platform.python_version(),
                 "cpu_count": os.cpu_count(), "cpus": _client_cpus()},
        **target, "model": info.model,
        "server": {"ours": info.ours, "max_model_len": info.max_model_len, "num_gpus": info.num_gpus,
                   "vocab_size": info.vocab_size, "models_entry": info.raw},
        "gpus": config.gpus,
        "mode": levels[0].mode,
        "levels": [{"mode": s.mode, "concurrency": s.concurrency, "rate": s.rate} for s in levels],
        "duration_s": config.duration_s, "warmup": config.warmup.describe(),
        "start_offset": list(config.start_offset), "time_scale": config.time_scale,
        "seed": config.seed, "timeout_s": config.timeout_s, "max_error_rate": config.max_error_rate,
        "slos": [{"name": slo.name, "spec": slo.spec} for slo in config.slos], "attainment_target": config.slo_target,
        "vocab": {"offset": vocab_offset, "size": vocab_size},
        "traces": {"source": args.traces or DEFAULT_SET, "name": traces.name, "format": traces.format,
                   "block_size": traces.block_size, "sessions": len(traces.sessions),
                   "requests": sum(1 for s in traces.sessions for _ in s.all_requests()),
                   "scale": scale_report.to_dict()},
    }


def _redacted(argv: list[str]) -> list[str]:
    """The command line without secrets: values of --api-key and --header become '***'."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg in ("--api-key", "--header"):
            out.append(arg)
            hide_next = True
        elif arg.startswith(("--api-key=", "--header=")):
            out.append(arg.partition("=")[0] + "=***")
        else:
            out.append(arg)
    return out


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git_revision() -> str | None:
    """HEAD of the checkout loadgen runs from (with '-dirty' for local changes), if it is one."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _record_writer(file: BinaryIO | None) -> Callable[[bytes], None] | None:
    if file is None:
        return None

    def write(lines: bytes) -> None:
        file.write(lines)

    return write


def _open_per_request(path: str | None) -> BinaryIO | None:
    if not path:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
