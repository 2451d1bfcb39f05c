"""How a recipe's run ran: the recipe fingerprint of its curve and the launch record its results keep.

The fingerprint identifies one curve the way InferenceX's `recipe_fingerprint` does (its
utils/process_changelog.py): the SHA-256 of the canonical JSON (sorted keys, no spaces, ASCII) of
everything that shapes the measurement except the points, so a recipe that only adds
concurrencies keeps its curves' fingerprints. Here that is the variant's server (kind, command,
URL, flags, environment, working directory, image, GPUs, CPUs), the workload, the SLO tiers and
the sweep without its levels (conc, rates) and its number of rounds; names, descriptions, how a
server's start is awaited and the comparison settings play no part.

Every run's result.json holds a launch record under `launch` (loadgen/run/provenance.py: loadgen's
command line, environment and versions, and the server's launch as far as the run could learn it);
`recipe run` adds what it knows of the run once it has finished:

    {"recipe": name, "variant": name, "round": k, "recipe_fingerprint": hex,
     "server": {"kind" (the recipe's), "argv" (the command line that started it; kept as the load
                recorded it when the recipe started nothing), "env" (what the recipe adds to the
                environment), "cwd" (kept as recorded when the recipe gives none), "image", "url"}}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from loadgen.recipe.schema import Recipe, Variant, to_dict

LAUNCH_KEY = "launch"
POINT_KEYS = ("conc", "rates", "repeats")  # a sweep's points and rounds: not the curve
NOT_CURVE = ("health_path", "startup_timeout_s")  # how a start is awaited: not what is measured


def recipe_fingerprint(recipe: Recipe, variant: Variant) -> str:
    """The SHA-256 (hex) of the variant's curve: see the module docstring."""
    plain = to_dict(recipe)
    server = {key: value for key, value in plain["server"].items() if key not in ("flags", "env", "cwd", *NOT_CURVE)}
    server.update(flags=recipe.server_flags(variant), env=recipe.server_env(variant), cwd=recipe.server_cwd(variant))
    curve = {"server": server, "workload": plain.get("workload", {}), "slos": plain.get("slos", {}),
             "sweep": {key: value for key, value in plain.get("sweep", {}).items() if key not in POINT_KEYS}}
    canonical = json.dumps(curve, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def launch_record(recipe: Recipe, variant: Variant, round_: int, server_argv: list[str],
                  url: str | None) -> dict[str, Any]:
    """What the recipe knows of one of its runs (module docstring), for `with_recipe`."""
    return {
        "recipe": recipe.name, "variant": variant.name, "round": round_,
        "recipe_fingerprint": recipe_fingerprint(recipe, variant),
        "server": {"kind": recipe.server.kind, "argv": server_argv or None, "env": recipe.server_env(variant),
                   "cwd": recipe.server_cwd(variant), "image": recipe.server.image, "url": url},
    }


def with_recipe(launch: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """The run's own launch record with the recipe's laid over it: a server command line or working directory
    the recipe does not know is kept as the run recorded it."""
    server = dict(launch.get("server") or {})
    for key, value in record["server"].items():
        if value is not None or key not in ("argv", "cwd"):
            server[key] = value
    if server.get("argv") is not None:
        server["argv_unknown"] = None
    return {**launch, **record, "server": server}


def stamp_launch(result: Path, record: dict[str, Any]) -> None:
    """Add the recipe's launch record to a finished run's result.json (rewritten atomically)."""
    from loadgen.results.file import read_results, write_results

    doc = read_results(result)
    doc[LAUNCH_KEY] = with_recipe(doc.get(LAUNCH_KEY) or {}, record)
    write_results(result, doc)
