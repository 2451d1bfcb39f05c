"""How a recipe's run ran: the recipe fingerprint of its curve and the launch record its results keep.

The fingerprint identifies one curve the way InferenceX's `recipe_fingerprint` does (its
utils/process_changelog.py): the SHA-256 of the canonical JSON (sorted keys, no spaces, ASCII) of
everything that shapes the measurement except the points, so a recipe that only adds
concurrencies keeps its curves' fingerprints. Here that is the variant's server (kind, command,
URL, flags, environment, working directory, image, GPUs, CPUs), the workload, the SLO tiers and
the sweep without its levels (conc, rates) and its number of rounds; names, descriptions, how a
server's start is awaited and the comparison settings play no part.

`recipe run` writes the launch record into each run's result.json under `launch`:

    {"recipe": name, "variant": name, "round": k, "recipe_fingerprint": hex,
     "server": {"kind", "argv" (the command line that started it, null for url/inprocess),
                "env" (what the recipe adds to the environment), "cwd", "image", "url"},
     "load_argv": the `loadgen replay|capacity|bench` command line of the run,
     "versions": {"python", "packages": {name: version} of this interpreter, which our server and the
                  in-process engine run on (a command server's are its image's)}}
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen.recipe.schema import Recipe, Variant, to_dict

LAUNCH_KEY = "launch"
POINT_KEYS = ("conc", "rates", "repeats")  # a sweep's points and rounds: not the curve
NOT_CURVE = ("health_path", "startup_timeout_s")  # how a start is awaited: not what is measured
OUR_PACKAGES = ("torch", "triton", "numpy", "aiohttp", "orjson")


def recipe_fingerprint(recipe: Recipe, variant: Variant) -> str:
    """The SHA-256 (hex) of the variant's curve: see the module docstring."""
    plain = to_dict(recipe)
    server = {key: value for key, value in plain["server"].items() if key not in ("flags", "env", "cwd", *NOT_CURVE)}
    server.update(flags=recipe.server_flags(variant), env=recipe.server_env(variant), cwd=recipe.server_cwd(variant))
    curve = {"server": server, "workload": plain.get("workload", {}), "slos": plain.get("slos", {}),
             "sweep": {key: value for key, value in plain.get("sweep", {}).items() if key not in POINT_KEYS}}
    canonical = json.dumps(curve, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def launch_record(recipe: Recipe, variant: Variant, round_: int, server_argv: list[str], url: str | None,
                  load_argv: list[str]) -> dict[str, Any]:
    """What one run of the recipe started and ran (module docstring)."""
    kind = recipe.server.kind
    packages = _versions(OUR_PACKAGES) if kind in ("ours", "inprocess") else {}
    return {
        "recipe": recipe.name, "variant": variant.name, "round": round_,
        "recipe_fingerprint": recipe_fingerprint(recipe, variant),
        "server": {"kind": kind, "argv": server_argv or None, "env": recipe.server_env(variant),
                   "cwd": recipe.server_cwd(variant), "image": recipe.server.image, "url": url},
        "load_argv": load_argv,
        "versions": {"python": platform.python_version(), "packages": packages},
    }


def stamp_launch(result: Path, record: dict[str, Any]) -> None:
    """Add the launch record to a finished run's result.json (rewritten atomically)."""
    from loadgen.results.file import read_results, write_results

    doc = read_results(result)
    doc[LAUNCH_KEY] = record
    write_results(result, doc)


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
