"""Command-line flags built from the config dataclasses' `cli(...)` field metadata.

`server start`, `loadgen bench` and `python -m server.parallel` call `add_engine_args` and
`engine_config_from_args`; `server start` also calls `add_http_args` and `http_config_from_args`.
Nothing here holds a default or a help text of its own: each flag's name, type, default and help
come from its field in server/config/, and argparse's dest is the field's name, so the parsed
values go back into the same dataclasses unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from server.config import (
    CacheConfig,
    EngineConfig,
    Flag,
    HttpConfig,
    ModelChoice,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeFlags,
)

# Every dataclass whose flagged fields become engine flags, in --help order.
FLAGGED_CONFIGS: tuple[type, ...] = (ModelChoice, EngineConfig, CacheConfig, SchedulerConfig,
                                     SpeculativeFlags, ParallelConfig)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add every engine flag to `parser`, one argument group per Flag.group."""
    add_config_args(parser, FLAGGED_CONFIGS)


def add_http_args(parser: argparse.ArgumentParser) -> None:
    """`server start`'s HTTP flags (HttpConfig)."""
    add_config_args(parser, (HttpConfig,))


def http_config_from_args(args: argparse.Namespace) -> HttpConfig:
    return HttpConfig(**_values(HttpConfig, args))


def add_config_args(parser: argparse.ArgumentParser, configs: tuple[type, ...]) -> None:
    """One flag per flagged field of each dataclass in `configs`, grouped by Flag.group."""
    groups: dict[str, Any] = {}
    for cls in configs:
        hints = typing.get_type_hints(cls)
        for f, flag in _flagged_fields(cls):
            if flag.group not in groups:
                groups[flag.group] = parser.add_argument_group(flag.group)
            groups[flag.group].add_argument(*flag.names, dest=f.name, **_argument_options(f, flag, hints[f.name]))


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build and validate an EngineConfig from parsed `add_engine_args` flags (ValueError names the flag)."""
    return EngineConfig(
        model=ModelChoice(**_values(ModelChoice, args)).build(),
        cache=CacheConfig(**_values(CacheConfig, args)),
        scheduler=SchedulerConfig(**_values(SchedulerConfig, args)),
        parallel=ParallelConfig(**_values(ParallelConfig, args)),
        speculative=SpeculativeFlags(**_values(SpeculativeFlags, args)).build(),
        **_values(EngineConfig, args),
    )


def _flagged_fields(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]


def _values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    # A `parse` flag arrives as its text and is read here, so its ValueError names the flag the
    # way every other configuration error does (argparse would say only "invalid value").
    return {f.name: flag.parse(value) if flag.parse is not None and isinstance(value, str) else value
            for f, flag in _flagged_fields(cls) for value in (getattr(args, f.name),)}


def _argument_options(f: dataclasses.Field, flag: Flag, annotation: Any) -> dict[str, Any]:
    default = f.default
    value_type = _value_type(annotation)
    if value_type is bool:
        # A switch flips the field's default: --no-prefix-caching stores False.
        return {"action": "store_false" if default else "store_true", "help": flag.help}
    if flag.parse is None and value_type not in (int, float, str):
        raise TypeError(f"{f.name}: a {annotation} flag needs cli(..., parse=...) to read its value")
    shown = flag.default_text if flag.default_text is not None else _show(default)
    options: dict[str, Any] = {"default": default, "type": str if flag.parse else value_type,
                               "help": flag.help if shown is None else f"{flag.help} (default: {shown})"}
    if flag.choices is not None:
        options["choices"] = flag.choices
    if flag.metavar is not None:
        options["metavar"] = flag.metavar
    return options


def _value_type(annotation: Any) -> Any:
    """int for `int` and `int | None`; the one non-None member of an Optional."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            raise TypeError(f"a flag's field needs one value type, got {annotation}")
        return members[0]
    return annotation


def _show(value: Any) -> str | None:
    """The default as --help states it; None (not given) states nothing."""
    if value is None:
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)
