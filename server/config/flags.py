"""How a config field becomes a command-line flag (`cli(...)` metadata), and the error that names it.

server/args.py builds argparse from the `Flag` of every flagged field; validation raises
ValueError through `require`, with a message that starts with the flag's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Flag:
    """How a config field appears on the command line; argparse's dest is the field's name.

    The type comes from the field's annotation (a bool field is a switch that flips its default),
    the default from the field's default; a field of another type (e.g. `tuple[int, ...]`) names
    the function that reads its value in `parse`. A new flag is one field, e.g.
    `enforce_eager: bool = field(default=False, metadata=cli("--enforce-eager", help="..."))`."""

    names: tuple[str, ...]
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    default_text: str | None = None  # "(default: ...)" when the value itself does not say it
    group: str = "engine"  # the --help section
    parse: Callable[[str], Any] | None = None


def cli(*names: str, help: str, choices: tuple[str, ...] | None = None, metavar: str | None = None,
        default_text: str | None = None, group: str = "engine",
        parse: Callable[[str], Any] | None = None) -> dict[str, Flag]:
    """Field metadata that makes the field a flag: `field(default=..., metadata=cli("--x", help=...))`."""
    return {"flag": Flag(names, help, choices, metavar, default_text, group, parse)}


def require(ok: bool, message: str) -> None:
    """Raise ValueError(message) unless ok; the message names the flag at fault."""
    if not ok:
        raise ValueError(message)
