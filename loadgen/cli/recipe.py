"""`loadgen recipe run|check FILE`: an A/B experiment from one YAML file (schema in
loadgen/recipe/schema.py, documented in README "Recipes"): every variant's server started in
turn, the sweep run with repeats interleaved across variants, each variant compared with the
first, and one results folder with every run, the comparisons and the HTML report.
`loadgen recipe from-infx CONFIG KEY` writes a recipe from an InferenceX config entry
(loadgen/recipe/from_infx.py); `loadgen recipe verify RECIPE RESULTS...` checks results against it
(loadgen/recipe/verify.py).

Exit codes: 0 done (or recipe valid), 1 a level failed in some run, 2 bad recipe or a server
that never became healthy, 130 interrupted (finished runs are kept: `--resume`).
"""

from __future__ import annotations

import argparse
import signal
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "recipe",
        help="run an A/B experiment from a YAML recipe (server, workload, sweep, variants)",
        description="A recipe names the server (ours, the in-process engine, an external command "
        "line such as vLLM's, or a URL), the workload, the sweep and the variants (flag overrides; "
        "the first is the baseline). See README 'Recipes' for the schema.",
    )
    commands = p.add_subparsers(dest="recipe_command", metavar="ACTION", required=True)
    run = commands.add_parser(
        "run", help="run every variant, compare each with the first, write one results folder",
        description="Start each variant's server, wait for its health check, run the sweep, stop it; "
        "sweep.repeats rounds with the variants interleaved, in orders balanced for position and predecessor "
        "(A B, B A, ...; A B C, B C A, C A B, C B A, A C B, B A C). "
        "Writes OUT/recipe.yaml, "
        "OUT/runs/<variant>-r<k>/result.json, OUT/compare/<variant>-vs-<baseline>.txt|.json and "
        "OUT/report/ (PNG plots of all runs on shared axes, report.html).",
    )
    run.add_argument("file", metavar="FILE", help="recipe YAML")
    run.add_argument("--out", metavar="DIR", help="results folder (default results/recipe-<name>-<UTC timestamp>/)")
    run.add_argument("--resume", action="store_true",
                     help="continue the recipe in --out: keep its finished runs, redo the rest")
    run.add_argument("--quiet", action="store_true", help="no progress lines, only errors")
    run.set_defaults(func=run_command)
    check = commands.add_parser("check", help="validate a recipe without running anything",
                                description="Check the recipe's keys, types and values, and its server "
                                "flags against the engine's; starts nothing.")
    check.add_argument("file", metavar="FILE", help="recipe YAML")
    check.set_defaults(func=check_command)
    from loadgen.recipe.from_infx import register_from_infx
    from loadgen.recipe.verify import register_verify

    register_from_infx(commands)  # `loadgen recipe from-infx CONFIG KEY`
    register_verify(commands)  # `loadgen recipe verify RECIPE RESULTS...`


def _load(path: str):
    from loadgen.errors import UsageError
    from loadgen.recipe.check import check_recipe
    from loadgen.recipe.schema import RecipeError, load_recipe

    try:
        recipe = load_recipe(path)
        check_recipe(recipe, path)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    return recipe


def check_command(args: argparse.Namespace) -> int:
    from loadgen.recipe.runner import plan, verdict_design

    recipe = _load(args.file)
    runs = plan(recipe)
    rounds, variants = recipe.sweep.repeats, recipe.variants
    print(f"{args.file}: ok: {len(variants)} variant{'s' * (len(variants) != 1)} "
          f"({', '.join(v.name for v in variants)}), {rounds} round{'s' * (rounds != 1)}, "
          f"{len(runs)} run{'s' * (len(runs) != 1)} (server.kind {recipe.server.kind})")
    print(verdict_design(recipe))
    return 0


def run_command(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone
    from pathlib import Path

    from loadgen.errors import UsageError
    from loadgen.recipe.runner import RecipeRun, RecipeRunError
    from loadgen.recipe.schema import RecipeError

    recipe = _load(args.file)
    if args.resume and not args.out:
        raise UsageError("--resume: needs --out, the folder of the interrupted recipe")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out or f"results/recipe-{recipe.name}-{stamp}")
    # Servers and load commands run in their own process groups (out of reach of a terminal's
    # Ctrl-C and of a kill of this process), so SIGTERM takes the same way out as Ctrl-C: every
    # group is stopped on the way. SIGINT is set too: a recipe started in the background by a
    # script inherits SIGINT ignored, which Python keeps, and `kill -INT` would do nothing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupt)
    try:
        return RecipeRun(recipe, out, args.resume, args.quiet).run()
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    except RecipeRunError as exc:
        print(f"loadgen recipe: error: {exc}\nfinished runs are kept in {out}; continue with "
              f"--resume --out {out}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"loadgen recipe: interrupted; finished runs are kept in {out}; continue with "
              f"--resume --out {out}", file=sys.stderr)
        return 130


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
