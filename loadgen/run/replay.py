"""One `loadgen replay` run: flags -> server info -> traces -> levels -> table and results file.

`replay_with` runs the same replay through any Transport (`loadgen bench` drives the engine
in-process with it); `replay_main` is the HTTP case. The flags are checked and resolved in
flags.py, the results' record of how the run was made is provenance.py's.

Kept apart from loadgen/cli/replay.py so `loadgen --help` never imports numpy, hdrh or the traces.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from loadgen.capacity.describe import describe_capacity, unheld_slo
from loadgen.defaults import DEFAULTS
from loadgen.errors import UsageError
from loadgen.report.table import format_level
from loadgen.results.file import SCHEMA, save_results
from loadgen.results.pareto import pareto
from loadgen.run import closed_loop, open_loop
from loadgen.run.event_loop import run_event_loop
from loadgen.run.flags import (
    build_sweep,
    check_flags,
    fit_bundled_sessions,
    load_traces,
    parse_headers,
    scrape_interval,
    speculative_expectation,
    vocab,
    warmup_timeout,
)
from loadgen.run.level import LevelLoad, LevelRun, RunConfig, Share, Warmup
from loadgen.run.plan import TimingConfig, max_subagents
from loadgen.run.progress import ProgressPrinter, describe
from loadgen.run.provenance import config_block, launch_block, utc_now
from loadgen.run.runner import Runner
from loadgen.run.summary import TraceHitRates, dumps_record, level_summary
from loadgen.run.sweep import Sweep
from loadgen.run.trace_cache import PackedTraces
from loadgen.run.validity import apply_submission, check_validity, describe_validity
from loadgen.run.workers import HttpTarget, LocalPool, Pool, ProcessPool, WorkerError, WorkerSetup, auto_workers
from loadgen.telemetry.gpu import GpuSampler, choose_source, gpu_block
from loadgen.telemetry.gpu_sources import NoGpuSource
from loadgen.telemetry.series import ServerSeries
from loadgen.transport.base import Transport, TransportError
from loadgen.transport.http import HttpTransport
from traces import PromptSynth, TraceSet
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
        options = check_flags(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    try:
        return run_event_loop(_replay(args, options, transport, target, http_target))
    finally:
        # The traces were loaded frozen and the run froze the heap. A caller's process goes on
        # (`bench`: frozen triton objects would outlive the final collection, and nanobind would
        # print leak warnings at exit).
        gc.unfreeze()


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

    expectation = speculative_expectation(args, info)
    for line in fit_bundled_sessions(args, info):
        printer.say(line)
    options["warmup"] = Warmup.parse(args.warmup)  # the preset's, when the search took it
    traces, scale_report = load_traces(args, info)
    sweep = build_sweep(args, options, traces)
    levels = sweep.sizing()
    config = RunConfig(
        duration_s=args.duration, warmup=options["warmup"],
        timing=TimingConfig(args.think_time_scale, args.think_time_cap),
        seed=args.seed, start_offset=options["start_offset"], time_scale=args.time_scale,
        timeout_s=args.timeout, max_error_rate=args.max_error_rate,
        gpus=args.gpus or info.num_gpus or 1, warmup_timeout_s=warmup_timeout(args),
        slos=options["slos"], slo_target=getattr(args, "attainment", DEFAULTS.attainment), live_slo=sweep.live_slo,
    )
    vocab_offset, vocab_size = vocab(args, info)
    planned_path = results_path = options["out_dir"] / "result.json"
    workers = _worker_count(args, options, levels, traces, http_target)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "created": utc_now(), "status": "complete", "message": None,
        "config": {**config_block(args, target, config, info, traces, scale_report, levels, vocab_offset, vocab_size),
                   "spec_decode": expectation.describe() if expectation else None},
        "levels": [], "pareto": None, "launch": launch_block(info, target.get("url")),
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
            printer.say(f"-- {step.load.label}{of}: {_level_plan(step.load, step.index, traces, config)}")
            series = ServerSeries(transport.metrics_text, interval) if (interval := scrape_interval(args)) else None
            level_started = time.perf_counter_ns()
            try:
                level, early, window_start = await _drive_level(pool, step.load, step.index, config, printer, sweep,
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


async def _drive_level(pool: Pool, load: LevelLoad, index: int, config: RunConfig, printer: ProgressPrinter,
                       sweep: Sweep, series: ServerSeries | None
                       ) -> tuple[LevelRun, str | None, int | None]:
    """Run one level on the pool, showing its progress; with several workers and a warm-up that
    counts requests, open the window once every worker's lanes are warm. The sweep may end the
    window early (a decided capacity probe). `series` scrapes the server's /metrics meanwhile, and
    once more after the drain. Returns the level, why it was ended early, and when (perf_counter
    ns, from the progress snapshots: the workers keep their own clocks' stamps) its window opened."""
    task = asyncio.ensure_future(pool.run_level(load, index))
    scraper = asyncio.ensure_future(series.run()) if series is not None else None
    started = time.monotonic()
    coordinate = pool.workers > 1 and load.mode == "closed" and bool(config.warmup.requests)
    opener = asyncio.ensure_future(pool.open_window_when_warm()) if coordinate else None
    early, window_start = None, None
    window_s = config.window_of(load)
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
            if early is None and (early := sweep.early_stop(snap, window_s)) is not None:
                await pool.end_window()
            printer.show(describe(load.label, snap, time.monotonic() - started, window_s,
                                  config.warmup_timeout_s, config.timeout_s))
    finally:
        for side in (opener, scraper):
            if side is not None and not side.done():
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)
        if not task.done():
            task.cancel()


def _level_plan(load: LevelLoad, index: int, traces: TraceSet, config: RunConfig) -> str:
    """What a level will do, before it starts: so a slow server can be told from a hung one."""
    warm = config.warmup
    if load.mode == "closed":
        plays = closed_loop.plays_of(traces, config, index, load.lanes)
        sessions, tokens = closed_loop.warmup_plan(plays, load.lanes, warm.requests)
        what = f"{_plural(load.lanes, 'lane')} over {_plural(sessions, 'session')}"
        warmup = (f"warm-up {warm.describe()} per lane" if warm.requests else
                  f"warm-up {warm.describe()}")
        warmup += f" (each lane first re-sends its start context: {tokens:,} prompt tokens"
        warmup += " in the warm-up requests)" if warm.requests else ")"
    else:
        tokens = open_loop.warmup_prompt_tokens(traces, config, load, index)
        what = f"Poisson arrivals at {load.rate:g}/s" if load.mode == "poisson" else "recorded arrivals"
        warmup = f"warm-up {warm.describe()}" + (f" ({tokens:,} prompt tokens)" if warm.requests else "")
    return f"{what}, {warmup}, window {config.window_of(load):g} s"


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


def _pool_size(levels: list[LevelLoad], traces: TraceSet, workers: int) -> int:
    """Connections per worker: every request the heaviest level can have in flight at once."""
    if levels[0].mode != "closed":
        return math.ceil(OPEN_LOOP_CONNECTIONS / workers)
    lanes = math.ceil(max(load.lanes for load in levels) / workers)
    return lanes * (1 + max_subagents(traces.sessions))


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


