"""What a results file records about how its run was made: its `config` block (the command line
without secrets, loadgen's version and git revision, the host and the CPUs the client ran on, the
server, the levels and the run's settings, and the traces as they were scaled) and its `launch`
block (how loadgen and the server were started)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from loadgen import __version__
from loadgen.run.affinity import format_cpus
from loadgen.run.level import LevelLoad, RunConfig
from loadgen.transport.base import ServerInfo
from traces import DEFAULT_SET, TraceSet


def _client_cpus() -> str | None:
    """The CPUs the client may run on ("0-3"; `taskset` or a recipe's sweep.client_cpus narrow it)."""
    return format_cpus(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def config_block(args, target: dict[str, Any], config: RunConfig, info: ServerInfo, traces: TraceSet, scale_report,
            levels: list[LevelLoad], vocab_offset: int, vocab_size: int) -> dict[str, Any]:
    from server.launch import redacted

    return {
        "command_line": redacted([Path(sys.argv[0]).name, *sys.argv[1:]]),
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
        "slos": [{"name": slo.name, "spec": slo.text} for slo in config.slos], "attainment_target": config.slo_target,
        "vocab": {"offset": vocab_offset, "size": vocab_size},
        "traces": {"source": args.traces or DEFAULT_SET, "name": traces.name, "format": traces.format,
                   "block_size": traces.block_size, "sessions": len(traces.sessions),
                   "requests": sum(1 for s in traces.sessions for _ in s.all_requests()),
                   "scale": scale_report.to_dict()},
    }


def launch_block(info: ServerInfo, url: str | None) -> dict[str, Any]:
    """The results' `launch` record of a run (docs/results_schema.md, "Launch record"): loadgen's own command
    line, environment and versions, and the server's launch as far as it is known: our server reports its
    own on its model card, the in-process engine is this process; another server's is unknown, never guessed.
    `loadgen recipe run` adds what its recipe started (loadgen/recipe/provenance.py)."""
    from server.launch import process_launch

    load = process_launch()
    reported = info.raw.get("launch") if info.ours else None
    if info.raw.get("transport") == "inprocess":
        kind, server, unknown = "inprocess", load, None
    elif isinstance(reported, dict):
        kind, server, unknown = "ours", reported, None
    else:
        kind, server = "other", {}
        unknown = ("our server did not report its launch (older than the launch record)" if info.ours else
                   "not our server: it does not report how it was started")
    return {
        "recipe": None, "variant": None, "round": None, "recipe_fingerprint": None,
        "server": {"kind": kind, "argv": server.get("argv"), "argv_unknown": unknown, "env": None,
                   "process_env": server.get("env"), "cwd": server.get("cwd"), "image": None, "url": url,
                   "versions": server.get("versions")},
        "load_argv": load["argv"], "load_env": load["env"], "load_cwd": load["cwd"], "versions": load["versions"],
    }


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


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
