"""`loadgen bench`: benchmark the engine in this process on real agentic sessions, then report.

The engine runs in-process (loadgen/transport/inprocess.py, no sockets) and is driven by the
same replay, load models and metrics as `loadgen replay`; every replay flag except the HTTP
target ones is accepted, and every engine flag of `server start`. `--seed` seeds both the load
(session order, offsets, salts, arrivals) and the engine's random weights.

With no arguments it is the embedded default: the bundled agentic-coding sessions scaled to the
model (`BENCH_PRESETS`), the tiny model on CPU (`small` when a GPU is visible), one level per
concurrency, a table per level, `results/<UTC timestamp>/result.json`, and PNG plots plus a
self-contained HTML report in `report/` beside it. Exit codes as `loadgen replay`.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from pathlib import Path

from loadgen.run.presets import BENCH_PRESETS, CPU_MODEL, GPU_MODEL, PRESET_FIELDS, flag_text, preset_flags, preset_for


def register(subparsers: argparse._SubParsersAction) -> None:
    from loadgen.capacity.config import add_search_flags
    from loadgen.cli.replay import add_replay_flags
    from server.args import add_engine_args

    p = subparsers.add_parser(
        "bench",
        help="benchmark the engine in-process on agentic sessions (the main job; no arguments needed)",
        description="Run the sparse-MLA engine in this process and replay agentic coding sessions\n"
        "against it, level by level, with the metrics of `loadgen replay` (no HTTP in between).\n"
        "With no arguments: the bundled agentic-coding traces scaled to the model, the tiny model\n"
        "on CPU (small on a GPU); prints a table per level and writes\n"
        "results/<UTC timestamp>/result.json, with PNG plots and report.html in report/ beside it.\n"
        "Engine flags are those of `server start`; with --speculative-config (and --golden-al/--thinking)\n"
        "each level reports the measured acceptance length beside the engine's own (golden) AL.",
        epilog=_preset_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # The engine's --seed and the replay's --seed are one flag here: the engine's definition wins.
        conflict_handler="resolve",
    )
    add_replay_flags(p, http=False)
    add_engine_args(p)
    for action in p._actions:
        if action.dest in PRESET_FIELDS:
            action.help = re.sub(r"\s*\(default[^)]*\)$", "", action.help or "") + " (default: see below)"
            action.default = None
        elif action.dest == "model":
            action.help = "model preset (shapes in docs/sparse_mla.md) (default: see below)"
            action.default = None
        elif action.dest == "seed":
            action.help = ("seeds the load (session order, offsets, salts, arrivals) and the engine's random weights "
                           "(default 0)")
    p.add_argument("--no-report", action="store_true", help="skip the PNG plots and the HTML report")
    p.add_argument("--capacity", action="store_true",
                   help="search the engine's capacity under the SLO instead of running --conc's levels, as "
                   "`loadgen capacity` does against a server (its flags below)")
    add_search_flags(p)
    p.set_defaults(func=run)


def _preset_text() -> str:
    lines = [f"defaults: --model {CPU_MODEL} on CPU, {GPU_MODEL} when a GPU is visible; "
             "--max-context: the engine's --max-model-len; per model:"]
    for model, preset in BENCH_PRESETS.items():
        lines.append(f"  {model}: " + flag_text(preset_flags(preset, PRESET_FIELDS)))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from loadgen.errors import UsageError
    from loadgen.run.flags import default_out_dir
    from loadgen.run.replay import replay_with
    from loadgen.transport.inprocess import EngineConfigError, InProcessTransport, engine_config_from_args

    if args.model is None:
        args.model = _default_model(args.device)
    _apply_preset(args)
    try:
        config = engine_config_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    transport = InProcessTransport(config, args.timeout)
    if not args.quiet:
        print(f"bench: the {config.model.name} engine on {transport.device}, in this process", flush=True)
    if args.out is None:
        args.out = str(default_out_dir())
    try:
        _build_engine(transport, args.quiet)
        code = replay_with(args, transport, transport.describe())
    except EngineConfigError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        transport.shutdown()
    if not args.no_report:
        from loadgen.report.html import write_report_folder

        write_report_folder(Path(args.out), args.quiet)
    return code


def _build_engine(transport, quiet: bool) -> None:
    """Build the engine here (it takes from seconds to minutes), with its elapsed time shown live."""
    from loadgen.defaults import DEFAULTS
    from loadgen.run.progress import ProgressPrinter

    printer = ProgressPrinter(DEFAULTS.piped_progress_interval_s, enabled=not quiet)
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(DEFAULTS.progress_interval_s):
            printer.show(f"bench: engine starting, {time.monotonic() - started:.0f} s")

    ticker = threading.Thread(target=tick, name="agentload-engine-start-progress", daemon=True)
    ticker.start()
    try:
        transport.build_engine()
    finally:
        done.set()
        ticker.join()
        printer.clear()
    printer.say(f"bench: engine ready in {time.monotonic() - started:.1f} s")


def _default_model(device: str) -> str:
    from server.config import resolve_device

    return GPU_MODEL if resolve_device(device) == "cuda" else CPU_MODEL


def _apply_preset(args: argparse.Namespace) -> None:
    preset = preset_for(args.model)
    for name in PRESET_FIELDS:
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
