"""`loadgen recipe check`: what the schema cannot see - server flags checked against the engine's
own flag definitions (names, types, choices), workload keys the chosen server cannot take, and
the GPU memory shares of kept servers side by side on one GPU. Nothing is started; the error
names the recipe key."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

from loadgen.recipe.memory import check_shares
from loadgen.recipe.schema import FlagValue, Recipe, RecipeError
from loadgen.recipe.server import flag_args

# `server start` flags beyond the engine's that a recipe may set; --host/--port are the recipe's own.
OUR_HTTP_FLAGS = ("api_key", "max_body_mb", "max_queue", "served_model_name", "shutdown_timeout")
RESERVED = ("host", "port")
HTTP_ONLY_WORKLOAD = ("golden_al", "spec_k", "thinking", "model")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # raise instead of exiting
        raise ValueError(message)


def check_recipe(recipe: Recipe, source: str) -> None:
    """RecipeError naming `source` and the key for anything the variants' servers would reject."""
    try:
        _check(recipe)
    except RecipeError as exc:
        raise RecipeError(f"{source}: {exc}") from None


def _check(recipe: Recipe) -> None:
    from loadgen.compare import CompareError, load_run_noise

    if recipe.compare.run_noise is not None:
        try:
            load_run_noise(recipe.compare.run_noise)
        except CompareError as exc:
            raise RecipeError(f"compare.run_noise: {str(exc).removeprefix('--run-noise: ')}") from None
    _check_cwds(recipe)
    kind = recipe.server.kind
    if kind == "inprocess":
        for name in HTTP_ONLY_WORKLOAD:
            if getattr(recipe.workload, name) is not None:
                raise RecipeError(f"workload.{name}: the in-process engine is not reached over HTTP; give "
                                  f"golden_al/thinking as engine flags (server.flags) instead")
        if recipe.workload.endpoint != "completions":
            raise RecipeError("workload.endpoint: the in-process engine has no HTTP endpoint")
    if kind not in ("ours", "inprocess"):
        return
    parser = _engine_parser()
    for where, flags in _places(recipe, "flags"):
        for key, value in flags:
            _check_flag(parser, kind, f"{where}.{key}", key, value)
    check_shares(recipe)


def _check_cwds(recipe: Recipe) -> None:
    """Every working directory given exists; for our server, it holds a tree of this repository."""
    for where, cwd in _places(recipe, "cwd"):
        if cwd is None:
            continue
        if not Path(cwd).is_dir():
            raise RecipeError(f"{where}: {cwd} is not a directory")
        if recipe.server.kind == "ours" and not (Path(cwd) / "server" / "cli.py").is_file():
            raise RecipeError(f"{where}: {cwd} holds no server/cli.py (kind ours runs `python -m server.cli` "
                              f"there, so it must be a tree of this repository)")


def _places(recipe: Recipe, key: str) -> list[tuple[str, Any]]:
    """(recipe key, value) of `key` in the server section and in each variant."""
    return [(f"server.{key}", getattr(recipe.server, key))] + [
        (f"variants[{i}].{key}", getattr(v, key)) for i, v in enumerate(recipe.variants)]


def _engine_parser() -> _Parser:
    from server.args import add_engine_args

    parser = _Parser(add_help=False)
    add_engine_args(parser)
    return parser


def _check_flag(parser: _Parser, kind: str, where: str, key: str, value: FlagValue) -> None:
    if key in RESERVED:
        raise RecipeError(f"{where}: set by the recipe (the server listens on 127.0.0.1 and a free port)")
    if key == "seed" and kind == "inprocess":
        raise RecipeError(f"{where}: the in-process engine takes its seed from sweep.seed")
    if kind == "ours" and key in OUR_HTTP_FLAGS:
        return
    # A key names a flag as written without its dashes (`tp`, `tensor_parallel_size`) or by its dest.
    known = {action.dest for action in parser._actions} | {
        name.lstrip("-").replace("-", "_") for action in parser._actions for name in action.option_strings}
    if key not in known:
        raise RecipeError(f"{where}: not an engine flag of `server start` (known: {', '.join(sorted(known))})")
    try:
        parser.parse_args(flag_args({key: value}))
    except ValueError as exc:
        raise RecipeError(f"{where}: {exc}") from None
