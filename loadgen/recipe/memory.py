"""GPU memory of kept servers: with `sweep.servers: kept`, every variant's server of kind ours runs
side by side with the others, and each one alone would take the engine's default share of its GPU
(`--gpu-memory-utilization`), so the second to start would run out of memory.

Servers share a GPU when the first `--tp` devices of their CUDA_VISIBLE_DEVICES (the recipe's env,
else loadgen's) overlap. When none of them sets gpu_memory_utilization, each is started with an
equal share (`even_share`): every variant gets the same memory, whichever GPU it is on, so the
comparison is not one of cache sizes. When some set it, `check_shares` refuses a recipe in which
a shared GPU would be given more than all of its memory, or would hold a server without a share.
(`--kv-cache-gb` sizes the cache on the CPU only, so it plays no part here.)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from loadgen.recipe.schema import FlagValue, Recipe, RecipeError, Variant

FLAG = "gpu_memory_utilization"
# All servers together get the engine's default share of one GPU; the rest is left to what no
# share counts (each process's CUDA context, the allocator's fragmentation).
TOTAL = 0.9


@dataclass(frozen=True, slots=True)
class _Kept:
    """One variant's kept server on the GPU: which devices it uses and the share it asks for."""

    index: int
    variant: Variant
    gpus: frozenset[str]
    share: float | None  # its gpu_memory_utilization; None: not given (the engine's default)


def gpu_visible() -> bool:
    """Whether `--device auto` resolves to CUDA, as the server resolves it (through the in-process
    transport, loadgen's one door to the server package)."""
    from loadgen.transport.inprocess import resolve_device

    return resolve_device("auto") == "cuda"


def even_share(recipe: Recipe) -> float | None:
    """The gpu_memory_utilization every kept server gets when some GPU is shared and none of them
    sets one (TOTAL split over the most servers on one GPU, rounded down); None: flags as given."""
    kept = _kept(recipe)
    crowd = _crowd(kept)
    if crowd < 2 or any(server.share is not None for server in kept):
        return None
    return _split(crowd)


def memory_flags(recipe: Recipe, variant: Variant) -> dict[str, FlagValue]:
    """Flags added to the variant's server command line: its even share of a shared GPU, if any."""
    share = even_share(recipe)
    if share is None or all(server.variant.name != variant.name for server in _kept(recipe)):
        return {}
    return {FLAG: share}


def split_note(recipe: Recipe) -> str | None:
    """One line for the recipe's output when the servers are given an even share."""
    share = even_share(recipe)
    if share is None:
        return None
    kept = _kept(recipe)
    return (f"kept servers: {_crowd(kept)} share one GPU, so each of the {len(kept)} starts with "
            f"--gpu-memory-utilization {share:g}, an even split (server.flags.{FLAG} sets another)")


def check_shares(recipe: Recipe) -> None:
    """RecipeError naming the key when kept servers on one GPU would ask for more than all of it,
    or when some give their share and one beside them would take the engine's default."""
    kept = _kept(recipe)
    crowd = _crowd(kept)
    given = [server for server in kept if server.share is not None]
    if crowd < 2 or not given:
        return
    fix = (f"give each of the {crowd} servers on one GPU at most {1 / crowd:.3g} of it (server.flags.{FLAG}, or "
           f"each variant's flags), or leave {FLAG} out everywhere for an even split of {_split(crowd):g} each")
    for gpu in sorted(set().union(*(server.gpus for server in kept))):
        on_it = [server for server in kept if gpu in server.gpus]
        if len(on_it) < 2:
            continue
        missing = [server for server in on_it if server.share is None]
        if missing:
            raise RecipeError(f"variants[{_owner(missing[0])}].flags.{FLAG}: missing, while {_key(recipe, given[0])} "
                              f"gives a share: the kept servers of {_names(on_it)} run side by side on GPU {gpu}, "
                              f"and one without a share takes the engine's default, most of the GPU; {fix}")
        total = sum(server.share or 0.0 for server in on_it)
        if total > 1.0 + 1e-9:
            keys = ", ".join(dict.fromkeys(_key(recipe, server) for server in on_it))
            shares = " + ".join(f"{server.share:g}" for server in on_it)
            raise RecipeError(f"{keys}: the kept servers of {_names(on_it)} run side by side on GPU {gpu} and ask "
                              f"for {shares} = {total:g} of its memory, more than all of it; {fix}")


def _kept(recipe: Recipe) -> list[_Kept]:
    """The kept servers of kind ours that run on a GPU (none unless the recipe keeps them)."""
    if recipe.server.kind != "ours" or recipe.sweep.servers != "kept" or len(recipe.variants) < 2:
        return []
    out = []
    for index, variant in enumerate(recipe.variants):
        flags = recipe.server_flags(variant)
        gpus = _gpus(flags, recipe.server_env(variant))
        if gpus:
            share = flags.get(FLAG, False)
            out.append(_Kept(index, variant, gpus, None if share is False else float(share)))
    return out


def _gpus(flags: dict[str, FlagValue], env: dict[str, str]) -> frozenset[str]:
    """The devices a server of kind ours runs on, as CUDA_VISIBLE_DEVICES names them; empty on the CPU."""
    device = flags.get("device", "auto")
    if device == "cpu" or (device == "auto" and not gpu_visible()):
        return frozenset()
    try:
        count = max(1, int(flags.get("tp", flags.get("tensor_parallel_size", 1))))
    except ValueError:  # `check` names a --tp that is not a number
        count = 1
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is None:
        return frozenset(str(n) for n in range(count))
    return frozenset(name.strip() for name in visible.split(",")[:count] if name.strip())


def _crowd(kept: list[_Kept]) -> int:
    """The most kept servers on any one GPU."""
    return max((sum(gpu in server.gpus for server in kept) for gpu in set().union(*(s.gpus for s in kept))),
               default=0)


def _split(crowd: int) -> float:
    """TOTAL over `crowd` servers, rounded down to a thousandth."""
    return math.floor(TOTAL / crowd * 1000) / 1000


def _owner(server: _Kept) -> int:
    """The variant whose flags the server runs with (a control: the baseline's)."""
    return 0 if server.variant.control else server.index


def _key(recipe: Recipe, server: _Kept) -> str:
    """The recipe key that gives the server its share: its own variant's flag, or the server's."""
    owner = _owner(server)
    if FLAG in dict(recipe.variants[owner].flags):
        return f"variants[{owner}].flags.{FLAG}"
    return f"server.flags.{FLAG}"


def _names(servers: list[_Kept]) -> str:
    return ", ".join(server.variant.name for server in servers)
