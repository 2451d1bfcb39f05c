"""The `loadgen` command: one subcommand per module, each registering its own parser.

A command module exposes `register(subparsers)`, which adds its parser and sets `func` to a
callable taking the parsed namespace and returning an exit code. Modules keep heavy imports
inside their run functions so that `loadgen --help` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from loadgen.errors import UsageError

# Order is the order in `loadgen --help`.
COMMAND_MODULES = (
    "loadgen.cmd_bench",
    "loadgen.cmd_traces",
    "loadgen.cmd_golden_al",
    "loadgen.cmd_replay",
    "loadgen.cmd_report",
    "loadgen.cmd_compare",
    "loadgen.cmd_recipe",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadgen",
        description="Replay agentic coding sessions against LLM servers and measure them.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean bad input (a trace, a curve, a flag): reported plainly, never a traceback."""
    from golden_al.curves import CurveError
    from traces.schema import TraceError

    return (UsageError, TraceError, CurveError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _user_errors() as exc:
        print(f"loadgen {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("loadgen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
