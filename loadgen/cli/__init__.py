"""The `loadgen` command (`python -m loadgen.cli`): one subcommand per module of this package, each
registering its own parser.

A command module exposes `register(subparsers)`, which adds its parser and sets `func` to a
callable taking the parsed namespace and returning an exit code. Modules keep heavy imports
inside their run functions so that `loadgen --help` starts fast, and a command line that names
a command registers only that one: registering `bench` imports the server's flags, which
`replay` must not wait for before its first request.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from loadgen.errors import UsageError

# command -> its module; the order is the order in `loadgen --help`.
COMMAND_MODULES = {
    "bench": "loadgen.cli.bench",
    "traces": "loadgen.cli.traces",
    "golden-al": "loadgen.cli.golden_al",
    "replay": "loadgen.cli.replay",
    "capacity": "loadgen.cli.capacity",
    "report": "loadgen.cli.report",
    "compare": "loadgen.cli.compare",
    "recipe": "loadgen.cli.recipe",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `loadgen` parser; when `argv` starts with a command's name, only that command is
    registered (anything else, `--help` or a typo, gets them all, for the listing)."""
    parser = argparse.ArgumentParser(
        prog="loadgen",
        description="Replay agentic coding sessions against LLM servers and measure them.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = COMMAND_MODULES.get(argv[0]) if argv else None
    for module in [named] if named else COMMAND_MODULES.values():
        importlib.import_module(module).register(subparsers)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean bad input (a trace, a curve, a flag): reported plainly, never a traceback."""
    from golden_al.curves import CurveError
    from traces.schema import TraceError

    return (UsageError, TraceError, CurveError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _user_errors() as exc:
        print(f"loadgen {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # torch and the rest of the engine's: the server extra
        from server.extra import exit_missing_extra

        return exit_missing_extra(exc, f"loadgen {args.command}")
    except KeyboardInterrupt:
        print("loadgen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout left (`loadgen report ... | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is quiet too
        return 141  # 128 + SIGPIPE, as a shell reports a pipe's writer that was cut off

