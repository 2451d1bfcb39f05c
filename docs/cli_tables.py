"""The flag tables in docs/*.md, generated from the argparse definitions of `loadgen` and `server`.

A block `<!-- cli:loadgen replay -->` ... `<!-- /cli -->` holds the tables of that command (flags
grouped as its --help groups them; a command with subcommands lists them). Run
`python docs/cli_tables.py` to rewrite every block, `--check` to only report the stale ones and the
commands no document has a block for (tests/test_cli_docs.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BLOCK = re.compile(r"(<!-- cli:(?P<command>[\w -]+?) -->\n)(?P<body>.*?)(<!-- /cli -->)", re.S)


def root_parser(program: str, first: str | None = None) -> argparse.ArgumentParser:
    """`loadgen`'s parser (with every command, or only `first`, as its CLI builds it) or `server`'s."""
    if program == "loadgen":
        from loadgen.cli import build_parser

        return build_parser([first] if first else None)
    if program == "server":
        from server.cli import build_parser as build_server_parser

        return build_server_parser()
    raise KeyError(f"unknown program {program!r}")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def find_parser(command: str) -> argparse.ArgumentParser:
    """The parser of a command line such as `loadgen recipe run`."""
    program, *names = command.split()
    parser = root_parser(program, names[0] if names else None)
    for name in names:
        subcommands = _subcommands(parser)
        if subcommands is None or name not in subcommands.choices:
            raise KeyError(f"no command {command!r}")
        parser = subcommands.choices[name]
    return parser


def leaf_commands() -> Iterator[str]:
    """Every command line that runs something (`loadgen replay`, `loadgen recipe run`, `server start`)."""
    def walk(parser: argparse.ArgumentParser, command: str) -> Iterator[str]:
        subcommands = _subcommands(parser)
        if subcommands is None:
            yield command
            return
        for name, child in subcommands.choices.items():
            yield from walk(child, f"{command} {name}")

    for program in ("loadgen", "server"):
        yield from walk(root_parser(program), program)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def invocation(action: argparse.Action) -> str:
    """`--url URL`, `-n, --name N`, `RESULTS [RESULTS ...]`: the flag as the user types it."""
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = _metavar(action)
    if isinstance(action.nargs, int):
        value = " ".join([metavar] * action.nargs)
    else:
        value = {"?": f"[{metavar}]", "*": f"[{metavar} ...]", "+": f"{metavar} [{metavar} ...]"}.get(
            str(action.nargs), metavar)
    return f"{', '.join(action.option_strings)} {value}" if action.option_strings else value


def help_text(action: argparse.Action, prog: str) -> str:
    """The help string with its %(...)s expanded as argparse expands it, on one line."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = {key: value for key, value in vars(action).items() if value is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return " ".join((action.help % params).split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(header: tuple[str, str], rows: list[tuple[str, str]]) -> list[str]:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| `{_cell(name)}` | {_cell(text)} |" for name, text in rows]
    return lines


def render(command: str) -> str:
    """The markdown of one command's block (without its markers)."""
    parser = find_parser(command)
    lines = [f"Generated from `{command} --help` by `python docs/cli_tables.py`; do not edit by hand.", ""]
    subcommands = _subcommands(parser)
    if subcommands is not None:
        rows = [(f"{command} {choice.dest}", help_text(choice, parser.prog))
                for choice in subcommands._choices_actions]
        return "\n".join(lines + _table(("command", "what it does"), rows)) + "\n"
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        rows = [(invocation(a), help_text(a, parser.prog)) for a in actions]
        lines += [f"**{group.title}**", "", *_table(("flag", "meaning"), rows), ""]
    return "\n".join(lines[:-1]) + "\n"


def doc_files() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md"))


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("command")) + m.group(4), text)


def problems() -> list[str]:
    """Stale blocks and undocumented commands, one line each; empty when the docs match argparse."""
    found, documented = [], set()
    for path in doc_files():
        text = path.read_text()
        documented.update(m.group("command") for m in BLOCK.finditer(text))
        if rewrite(text) != text:
            found.append(f"{path.relative_to(REPO)}: flag tables differ from argparse")
    found += [f"no docs/*.md block <!-- cli:{command} -->" for command in leaf_commands()
              if command not in documented]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming each stale document or undocumented command")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run: python docs/cli_tables.py", file=sys.stderr)
        return 1 if found else 0
    for path in doc_files():
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
