"""Kept servers of kind ours side by side on one GPU: an even share of its memory on their command
lines when no variant gives one, and `loadgen recipe check` refusing shares that cannot all fit
(nothing is started and no GPU is needed: the device is named in the flags, or `auto` patched)."""

from __future__ import annotations

import pytest

from loadgen.recipe import memory
from loadgen.recipe.check import check_recipe
from loadgen.recipe.runner import RecipeRun, RecipeRunError
from loadgen.recipe.schema import Recipe, RecipeError, recipe_from_dict
from loadgen.recipe.server import server_command


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    """Servers that set no CUDA_VISIBLE_DEVICES start on GPU 0, whatever this machine sets."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


VARIANTS = [{"name": "fp8"}, {"name": "fp8-again", "control": True},
            {"name": "mxfp4", "flags": {"indexer_key_dtype": "mxfp4"}}]


def _recipe(flags: dict | None = None, variants: list | None = None, servers: str = "kept") -> Recipe:
    return recipe_from_dict({
        "name": "mem", "server": {"kind": "ours", "flags": {"model": "tiny", "device": "cuda", **(flags or {})}},
        "sweep": {"conc": [1], "servers": servers}, "variants": variants or VARIANTS}, "r.yaml")


def _shares(recipe: Recipe) -> list[str | None]:
    """Each variant's --gpu-memory-utilization on the command line the runner starts it with."""
    out = []
    for variant in recipe.variants:
        argv = server_command(recipe, variant, None)
        flag = "--gpu-memory-utilization"
        assert argv.count(flag) <= 1, argv
        out.append(argv[argv.index(flag) + 1] if flag in argv else None)
    return out


def _refusal(recipe: Recipe) -> str:
    with pytest.raises(RecipeError) as info:
        check_recipe(recipe, "r.yaml")
    return str(info.value)


def test_kept_servers_on_one_gpu_get_an_even_share_and_check_passes():
    """Three variants (a control too: it has its own kept server) on one GPU: 0.3 each, not the
    engine's default that would leave the second server out of memory."""
    recipe = _recipe()
    check_recipe(recipe, "r.yaml")
    assert _shares(recipe) == ["0.3", "0.3", "0.3"]
    two = _recipe(variants=VARIANTS[::2])
    assert _shares(two) == ["0.45", "0.45"]
    assert memory.split_note(two) == ("kept servers: 2 share one GPU, so each of the 2 starts with "
                                      "--gpu-memory-utilization 0.45, an even split "
                                      "(server.flags.gpu_memory_utilization sets another)")


def test_the_recipe_run_says_it_split_the_gpu(tmp_path, capsys, monkeypatch):
    def no_servers(self, variants):
        raise RecipeRunError("stopped before any server starts")

    monkeypatch.setattr(RecipeRun, "_start_kept", no_servers)
    with pytest.raises(RecipeRunError):
        RecipeRun(_recipe(), tmp_path / "out", resume=False, quiet=False).run()
    assert "recipe mem: kept servers: 3 share one GPU, so each of the 3 starts with --gpu-memory-utilization 0.3" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("recipe", [
    _recipe(servers="fresh"),  # one server at a time
    _recipe(flags={"device": "cpu"}),
    _recipe(variants=[VARIANTS[0]]),
    _recipe(flags={"gpu_memory_utilization": 0.3}),  # the recipe's own shares
    # each variant's server on its own GPU
    _recipe(variants=[{"name": "a", "env": {"CUDA_VISIBLE_DEVICES": "0"}},
                      {"name": "b", "env": {"CUDA_VISIBLE_DEVICES": "1"}}]),
], ids=["fresh", "cpu", "one-variant", "given", "own-gpus"])
def test_no_even_split_where_servers_do_not_share_a_gpu_or_give_their_share(recipe):
    check_recipe(recipe, "r.yaml")
    assert memory.split_note(recipe) is None
    given = recipe.server_flags(recipe.baseline).get("gpu_memory_utilization")
    assert set(_shares(recipe)) == {None if given is None else str(given)}


def test_device_auto_splits_only_when_a_gpu_is_visible(monkeypatch):
    recipe = _recipe(flags={"device": "auto"})
    monkeypatch.setattr(memory, "gpu_visible", lambda: True)
    assert _shares(recipe) == ["0.3", "0.3", "0.3"]
    monkeypatch.setattr(memory, "gpu_visible", lambda: False)
    assert _shares(recipe) == [None, None, None]


def test_tensor_parallel_servers_overlapping_on_a_gpu_share_it():
    """--tp 2 on GPUs 0,1 and a second server on 1,2: GPU 1 holds two."""
    recipe = _recipe(flags={"tp": 2}, variants=[{"name": "a", "env": {"CUDA_VISIBLE_DEVICES": "0,1"}},
                                                {"name": "b", "env": {"CUDA_VISIBLE_DEVICES": "1,2"}}])
    assert _shares(recipe) == ["0.45", "0.45"]


def test_check_refuses_shares_over_the_whole_gpu_naming_the_key():
    message = _refusal(_recipe(flags={"gpu_memory_utilization": 0.9}))
    assert message.startswith("r.yaml: server.flags.gpu_memory_utilization: the kept servers of fp8, fp8-again, "
                              "mxfp4 run side by side on GPU 0 and ask for 0.9 + 0.9 + 0.9 = 2.7 of its memory")
    assert "at most 0.333 of it" in message and "leave gpu_memory_utilization out everywhere" in message
    message = _refusal(_recipe(variants=[{"name": "a", "flags": {"gpu_memory_utilization": 0.5}},
                                         {"name": "b", "flags": {"gpu_memory_utilization": 0.6}}]))
    assert message.startswith("r.yaml: variants[0].flags.gpu_memory_utilization, "
                              "variants[1].flags.gpu_memory_utilization: the kept servers of a, b run side by side "
                              "on GPU 0 and ask for 0.5 + 0.6 = 1.1")


def test_check_refuses_a_server_without_a_share_beside_ones_with_one():
    message = _refusal(_recipe(variants=[{"name": "a"}, {"name": "b", "flags": {"gpu_memory_utilization": 0.4}}]))
    assert message.startswith("r.yaml: variants[0].flags.gpu_memory_utilization: missing, while "
                              "variants[1].flags.gpu_memory_utilization gives a share")
    assert "even split of 0.45 each" in message


def test_check_passes_shares_that_fit():
    check_recipe(_recipe(flags={"gpu_memory_utilization": 0.3}), "r.yaml")
    check_recipe(_recipe(variants=[{"name": "a", "flags": {"gpu_memory_utilization": 0.6}},
                                   {"name": "b", "flags": {"gpu_memory_utilization": 0.4}}]), "r.yaml")
    # 0.9 each, but on GPUs of their own
    check_recipe(_recipe(flags={"gpu_memory_utilization": 0.9},
                         variants=[{"name": "a", "env": {"CUDA_VISIBLE_DEVICES": "0"}},
                                   {"name": "b", "env": {"CUDA_VISIBLE_DEVICES": "1"}}]), "r.yaml")
