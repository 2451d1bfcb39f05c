"""One `loadgen replay` run: flags -> server info -> traces -> levels -> table and results file.

`replay_with` runs the same replay through any Transport (`loadgen bench` drives the engine
in-process with it); `replay_main` is the HTTP case.

Kept apart from cmd_replay.py so `loadgen --help` never imports numpy, hdrh or the traces.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from loadgen import __version__
from loadgen.cli import UsageError
from loadgen.cmd_replay import DEFAULT_FOREIGN_VOCAB, OUR_VOCAB, parse_headers, parse_list, parse_offset
from loadgen.pareto import pareto
from loadgen.plan import TimingConfig
from loadgen.results import SCHEMA, check_writable, save_results
from loadgen.runner import LevelRun, LevelSpec, RunConfig, Runner, Warmup, dumps_record, level_summary
from loadgen.spec import SpecExpectation, expectation_from_flags, server_card, server_default
from loadgen.table import format_level
from loadgen.transport.base import ServerInfo, Transport, TransportError
from loadgen.transport.http import HttpTransport
from traces import DEFAULT_SET, PromptSynth, TraceError, TraceSet, load_traces
from traces.scale import ScaleConfig, scale_traces
from traces.stats import theoretical_hit_rate

OPEN_LOOP_CONNECTIONS = 4096


def replay_main(args: argparse.Namespace) -> int:
    try:
        url = urlsplit(args.url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"--url: expected http://HOST:PORT or https://HOST:PORT, got {args.url!r}")
        headers = parse_headers(args.header)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    transport = HttpTransport(args.url, args.endpoint, args.model, args.api_key, headers, args.timeout)
    return replay_with(args, transport, {"url": args.url, "endpoint": args.endpoint})


def replay_with(args: argparse.Namespace, transport: Transport, target: dict[str, Any]) -> int:
    """Replay through `transport`; `target` (what was driven, e.g. the URL) goes into the results config."""
    try:
        options = _check_flags(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return _run_event_loop(_replay(args, options, transport, target))


def _check_flags(args: argparse.Namespace) -> dict[str, Any]:
    for flag, value in (("--duration", args.duration), ("--timeout", args.timeout)):
        if not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value:g}")
    if not 0 <= args.max_error_rate <= 1:
        raise ValueError(f"--max-error-rate: must be within 0..1, got {args.max_error_rate:g}")
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus: must be >= 1, got {args.gpus}")
    if args.repeat < 1:
        raise ValueError(f"--repeat: must be >= 1, got {args.repeat}")
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
        "conc": parse_list(args.conc, "--conc", int),
        "rates": parse_list(args.rate, "--rate", float) if args.rate else None,
        "warmup": Warmup.parse(args.warmup),
        "start_offset": parse_offset(args.start_offset),
    }


def _run_event_loop(coro) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _replay(args: argparse.Namespace, options: dict[str, Any], transport: Transport,
                  target: dict[str, Any]) -> int:
    say = (lambda text: None) if args.quiet else (lambda text: print(text, flush=True))
    await transport.open(max_connections=64)
    try:
        info = await transport.server_info()
    except TransportError as exc:
        await transport.close()
        print(f"loadgen {args.command}: error: {exc}", file=sys.stderr)
        return 1
    await transport.close()

    expectation = _spec_expectation(args, info)
    traces, scale_report = _load_traces(args, info)
    levels = _level_specs(args, options, traces)
    config = RunConfig(
        duration_s=args.duration, warmup=options["warmup"],
        timing=TimingConfig(args.think_time_scale, args.think_time_cap),
        seed=args.seed, start_offset=options["start_offset"], time_scale=args.time_scale,
        timeout_s=args.timeout, max_error_rate=args.max_error_rate,
        gpus=args.gpus or info.num_gpus or 1,
    )
    vocab_offset, vocab_size = _vocab(args, info)
    synth = PromptSynth(traces.block_size, vocab_size=vocab_size, vocab_offset=vocab_offset)
    planned_path = results_path = options["out_dir"] / "result.json"
    doc = {
        "schema": SCHEMA, "created": _utc_now(), "status": "complete", "message": None,
        "config": {**_config(args, target, config, info, traces, scale_report, levels, vocab_offset, vocab_size),
                   "spec_decode": expectation.describe() if expectation else None},
        "levels": [], "pareto": None,
    }
    per_request = _open_per_request(args.per_request)
    runner = Runner(
        transport, traces, synth, config, theoretical_hit_rate,
        on_request=(lambda rec: per_request.write(dumps_record(rec))) if per_request else None,
        progress=_progress_line if sys.stderr.isatty() and not args.quiet else None,
        spec=expectation,
    )
    loop = asyncio.get_running_loop()
    # The traces are many long-lived objects: keep the cyclic GC from walking them during the run.
    gc.collect()
    gc.freeze()
    try:
        await transport.open(max_connections=_pool_size(levels, traces))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.interrupt)
        for spec, repeat in ((spec, r) for spec in levels for r in range(args.repeat)):
            of = f" (repeat {repeat + 1} of {args.repeat})" if args.repeat > 1 else ""
            say(f"-- {spec.label}{of}: warm-up {config.warmup.describe()}, window {config.duration_s:g} s")
            level = await runner.run_level(spec)
            if sys.stderr.isatty() and not args.quiet:
                print("\r\033[K", end="", file=sys.stderr)
            summary = level_summary(level, config, runner.theoretical_hit_rate(level), expectation)
            summary["repeat"] = repeat
            doc["levels"].append(summary)
            results_path = _finish(doc, runner, results_path)
            say(format_level(doc["levels"][-1]))
            if runner.stopped:
                break
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await transport.close()
        if per_request:
            per_request.close()
        gc.unfreeze()
        results_path = _finish(doc, runner, results_path)
    say(f"results: {results_path}")
    return _exit_code(doc, runner, args.command) or int(results_path != planned_path)


def default_out_dir() -> Path:
    """results/<UTC timestamp>/: one folder per run, sortable by time."""
    return Path("results") / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _finish(doc: dict[str, Any], runner: Runner, path: Path) -> Path:
    """Write the results as they stand; returns where they went (a temporary file if `path` failed)."""
    doc["status"], doc["message"] = runner.status, runner.message
    doc["pareto"] = pareto(doc["levels"])
    return save_results(path, doc)


def _exit_code(doc: dict[str, Any], runner: Runner, command: str) -> int:
    if runner.status == "interrupted":
        print(f"loadgen {command}: interrupted; results of what ran are written", file=sys.stderr)
        return 130
    if runner.status == "server_dead":
        print(f"loadgen {command}: error: {runner.message}", file=sys.stderr)
        return 1
    failed = [level["label"] for level in doc["levels"] if level["failed"]]
    if failed:
        print(f"loadgen {command}: failed levels: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


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
    traces = load_traces(args.traces or DEFAULT_SET, args.trace_format)
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


def _level_specs(args: argparse.Namespace, options: dict[str, Any], traces: TraceSet) -> list[LevelSpec]:
    if options["rates"]:
        return [LevelSpec("poisson", rate=rate) for rate in options["rates"]]
    if traces.format == "mooncake":
        return [LevelSpec("mooncake")]
    return [LevelSpec("closed", concurrency=n) for n in options["conc"]]


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


def _pool_size(levels: list[LevelSpec], traces: TraceSet) -> int:
    from loadgen.plan import max_subagents

    if levels[0].mode != "closed":
        return OPEN_LOOP_CONNECTIONS
    return max(spec.concurrency for spec in levels) * (1 + max_subagents(traces.sessions))


def _config(args, target: dict[str, Any], config: RunConfig, info: ServerInfo, traces: TraceSet, scale_report,
            levels: list[LevelSpec], vocab_offset: int, vocab_size: int) -> dict[str, Any]:
    return {
        "command_line": _redacted([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "loadgen_version": __version__,
        "git_revision": _git_revision(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "machine": platform.machine(), "cpu_model": _cpu_model(), "python": platform.python_version(),
                 "cpu_count": os.cpu_count()},
        **target, "model": info.model,
        "server": {"ours": info.ours, "max_model_len": info.max_model_len, "num_gpus": info.num_gpus,
                   "vocab_size": info.vocab_size, "models_entry": info.raw},
        "gpus": config.gpus,
        "mode": levels[0].mode,
        "levels": [{"mode": s.mode, "concurrency": s.concurrency, "rate": s.rate} for s in levels],
        "duration_s": config.duration_s, "warmup": config.warmup.describe(),
        "start_offset": list(config.start_offset), "time_scale": config.time_scale,
        "seed": config.seed, "timeout_s": config.timeout_s, "max_error_rate": config.max_error_rate,
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


def _open_per_request(path: str | None) -> BinaryIO | None:
    if not path:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def _progress_line(level: LevelRun, duration_s: float) -> None:
    now = time.perf_counter_ns()
    if level.window_start_ns is None:
        where = f"warm-up {(now - level.started_ns) / 1e9:.0f} s"
        tput = ""
    else:
        elapsed = max(1e-9, (now - level.window_start_ns) / 1e9)
        where = f"{min(elapsed, duration_s):.0f}/{duration_s:g} s"
        tput = f" | {level.output_tokens / elapsed:.0f} out tok/s"
    errors = sum(level.errors.values())
    print(f"\r\033[K[{level.spec.label}] {where} | {level.ok} ok, {errors} errors, "
          f"{level.inflight} in flight{tput}", end="", file=sys.stderr, flush=True)


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
