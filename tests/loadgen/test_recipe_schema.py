"""Recipe schema and `loadgen recipe check`: the dict/YAML round trip, the shipped recipes, and one
clear error naming the key for each kind of bad recipe (nothing is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loadgen.cli import main
from loadgen.recipe.schema import (
    Recipe,
    RecipeError,
    ServerConfig,
    Sweep,
    Variant,
    load_recipe,
    recipe_from_dict,
    to_dict,
    to_yaml,
)

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

GOOD = {
    "name": "t", "server": {"kind": "ours", "flags": {"model": "tiny", "device": "cpu"}},
    "workload": {"token_scale": 0.02}, "sweep": {"conc": [1, 2], "duration_s": 5, "repeats": 2},
    "variants": [{"name": "fp8"}, {"name": "mxfp4", "flags": {"indexer-key-dtype": "mxfp4"}}],
}


def _with(**changes) -> dict:
    return {**GOOD, **changes}


def test_a_recipe_built_in_code_round_trips_through_yaml():
    recipe = Recipe(name="x", server=ServerConfig(kind="command", command="vllm serve m --port {port}"),
                    sweep=Sweep(rates=(1.0, 2.0)), variants=(Variant("a"), Variant("b", flags=(("block_size", 128),))))
    again = recipe_from_dict(yaml.safe_load(to_yaml(recipe)))
    assert again == recipe
    assert to_dict(recipe)["variants"][1] == {"name": "b", "flags": {"block_size": 128}}
    assert recipe.server_flags(recipe.variants[1]) == {"block_size": 128}


@pytest.mark.parametrize("name,design", [("seed.yaml", "5 rounds as blocks of 3 variants, t on 8 df"),
                                         ("cpu-smoke.yaml", "2 rounds paired, t on 1 df; two variants find"),
                                         ("vllm.yaml", "5 rounds as blocks of 3 variants, t on 8 df"),
                                         ("seed-capacity.yaml", "capacity under interactive, 5 rounds paired as "
                                                                "blocks of 3 variants, t on 8 df"),
                                         ("cpu-capacity.yaml", "capacity under standard, 3 rounds paired as "
                                                               "blocks of 3 variants, t on 4 df"),
                                         ("long-prefill.yaml", "4 rounds paired, t on 3 df")])
def test_shipped_recipes_check(name, design, capsys):
    """check validates and says how the verdicts will be drawn (two variants: how to add power)."""
    assert main(["recipe", "check", str(RECIPES / name)]) == 0
    out = capsys.readouterr().out
    assert "ok:" in out and f"verdicts: {design}" in out


@pytest.mark.parametrize("sweep,variants,design", [
    ({"repeats": 1}, None, "one run per side, session bootstrap - the run-to-run noise is not in the interval"),
    ({}, [{"name": "fp8"}], "none (one variant"),
    ({"repeats": 4}, None, "4 rounds paired, t on 3 df; two variants find a 10 % change only at a small run noise"),
    ({"repeats": 4}, [{"name": "fp8"}, {"name": "again", "control": True}], "4 rounds paired, t on 3 df"),
])
def test_the_verdict_line_names_the_test_a_recipe_gets(sweep, variants, design):
    from loadgen.recipe.runner import verdict_design

    doc = _with(sweep={**GOOD["sweep"], **sweep}, variants=variants or GOOD["variants"])
    line = verdict_design(recipe_from_dict(doc))
    assert line.startswith(f"verdicts: {design}")
    assert variants is None or "control: true" not in line  # a control is there already: no advice


def test_the_seed_recipe_is_the_issue_experiment():
    recipe = load_recipe(str(RECIPES / "seed.yaml"))
    flags = [recipe.server_flags(v) for v in recipe.variants]
    assert {f["indexer_key_dtype"] for f in flags} == {"fp8", "mxfp4"}
    assert {f["block_size"] for f in flags} == {64, 128}
    assert '"synthetic_acceptance_length": 3.51' in flags[0]["speculative_config"]
    assert recipe.workload.thinking == "auto"


def test_a_control_copies_the_baseline_not_the_server_section(tmp_path):
    """The baseline's own flags and cwd (an older tree, say) are what its A/A copy runs."""
    recipe = recipe_from_dict(_with(variants=[{"name": "old", "cwd": str(tmp_path), "flags": {"block_size": 32}},
                                              {"name": "new"}, {"name": "old2", "control": True}]))
    old, new, control = recipe.variants
    assert recipe.server_key(control) == recipe.server_key(old) != recipe.server_key(new)
    assert recipe.server_cwd(control) == str(tmp_path) and recipe.server_flags(control)["block_size"] == 32


def test_think_time_scale_zero_runs_the_sessions_back_to_back():
    """As `loadgen replay --think-time-scale 0`: the server's capacity on the sessions."""
    assert recipe_from_dict(_with(workload={"think_time_scale": 0})).workload.think_time_scale == 0


@pytest.mark.parametrize("doc, message", [
    (_with(sweeps={}), "sweeps: unknown key"),
    (_with(sweep={"conc": [1], "duration_s": "long"}), "sweep.duration_s: expected a number, got a string 'long'"),
    (_with(sweep={"conc": ["x"]}), "sweep.conc[0]: expected an integer"),
    (_with(sweep={"conc": [1], "rates": [2.0]}), "give exactly one of sweep.conc, sweep.rates and sweep.capacity"),
    ({k: v for k, v in GOOD.items() if k != "server"}, "server: missing (required)"),
    (_with(server={"kind": "docker"}), "server.kind: must be one of ours, inprocess, command, url"),
    (_with(server={"kind": "command", "command": "vllm serve m"}), "server.command: must contain {port}"),
    (_with(variants=[{"name": "a"}, {"name": "b", "flags": {"model": "tiny"}}]),
     "variants[1] (b): overrides nothing"),
    (_with(variants=[{"name": "a"}, {"name": "a", "control": True}]), "variants[1].name: 'a' is used twice"),
    (_with(variants=[{"name": "a", "flags": {"block_size": [1, {"x": None}]}}, {"name": "b", "extra": 1}]),
     "variants[1].extra: unknown key"),
    (_with(workload={"thinking": "auto"}), "workload.thinking: only meaningful with workload.golden_al"),
    (_with(workload={"token_scale": 0}), "workload.token_scale: must be positive, got 0"),
    (_with(workload={"think_time_scale": -1}), "workload.think_time_scale: must be >= 0, got -1"),
    (_with(compare={"metrics": ["speed"]}), "compare.metrics[0]: unknown metric 'speed'"),
    (_with(sweep={"conc": [1], "servers": "pooled"}), "sweep.servers: must be one of fresh, kept"),
    (_with(server={"kind": "inprocess"}, sweep={"conc": [1], "servers": "kept"}),
     "sweep.servers: kept needs servers the recipe starts (server.kind ours or command), not inprocess"),
    (_with(variants=[{"name": "a"}, {"name": "b", "cwd": "/x"}], server={"kind": "inprocess"}),
     "variants[1] (b).cwd: only for a server the recipe starts (kind ours or command), not kind inprocess"),
    (_with(variants=[{"name": "a"}, {"name": "b", "control": True, "cwd": "/x"}]),
     "variants[1] (b).control: a control copies the baseline; drop its flags/env/cwd"),
    (_with(server={"kind": "ours", "cwd": "/x"}, variants=[{"name": "a"}, {"name": "b", "cwd": "/x"}]),
     "variants[1] (b): overrides nothing (same server flags, env and cwd as the baseline)"),
    (_with(variants=[{"name": "a"}, {"name": "b", "cwd": "."}]),
     "variants[1] (b): overrides nothing"),  # "." is loadgen's own directory, where the baseline runs
    (_with(variants=[{"name": "a"}, {"name": "b", "cwd": ""}]), "variants[1] (b).cwd: empty"),
])
def test_bad_recipes_name_the_key(doc, message):
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(doc, "r.yaml")
    assert str(info.value).startswith("r.yaml: ") and message in str(info.value)


@pytest.mark.parametrize("change, message", [
    ({"variants": [{"name": "a"}, {"name": "b", "flags": {"indexer_key_dtype": "fp4"}}]},
     "variants[1].flags.indexer_key_dtype: argument --indexer-key-dtype: invalid choice: 'fp4'"),
    ({"variants": [{"name": "a"}, {"name": "b", "flags": {"blok_size": 32}}]},
     "variants[1].flags.blok_size: not an engine flag of `server start`"),
    ({"server": {"kind": "ours", "flags": {"port": 9000}}}, "server.flags.port: set by the recipe"),
    ({"server": {"kind": "ours", "flags": {"max_num_seqs": "many"}}}, "server.flags.max_num_seqs: argument"),
    ({"server": {"kind": "inprocess"}, "workload": {"golden_al": "dsv4_mtp"}}, "workload.golden_al: the in-process"),
    ({"variants": [{"name": "a"}, {"name": "old", "cwd": "/nonexistent/tree"}]},
     "variants[1].cwd: /nonexistent/tree is not a directory"),
    ({"server": {"kind": "ours", "cwd": str(RECIPES)}},
     f"server.cwd: {RECIPES} holds no server/cli.py (kind ours runs `python -m server.cli` there"),
    # kept servers side by side on one GPU, each asking for most of it (tests/loadgen/test_recipe_memory.py)
    ({"server": {"kind": "ours", "flags": {"model": "tiny", "device": "cuda", "gpu_memory_utilization": 0.9}},
      "sweep": {"conc": [1], "servers": "kept"}},
     "server.flags.gpu_memory_utilization: the kept servers of fp8, mxfp4 run side by side on GPU"),
])
def test_check_names_the_flag_and_exits_2(tmp_path, capsys, change, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_with(**change)))
    assert main(["recipe", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: " in err and message in err, err


def test_unreadable_and_non_yaml_files(tmp_path, capsys):
    assert main(["recipe", "check", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read" in capsys.readouterr().err
    (tmp_path / "x.yaml").write_text("name: [unclosed")
    assert main(["recipe", "check", str(tmp_path / "x.yaml")]) == 2
    assert "x.yaml: not valid YAML" in capsys.readouterr().err


def test_rounds_balance_position_and_predecessor():
    """Williams orders: over a full cycle every variant runs in every position and right after
    every other variant equally often (a plain rotation gives each variant one fixed predecessor)."""
    from collections import Counter
    from itertools import pairwise

    from loadgen.recipe.runner import plan, round_orders

    recipe = recipe_from_dict(_with(variants=[{"name": "a"}, {"name": "b", "control": True},
                                              {"name": "c", "flags": {"block_size": 128}}],
                                    sweep={"conc": [1], "repeats": 7}))
    names = [r.name for r in plan(recipe)]
    assert names[:9] == ["a-r1", "b-r1", "c-r1", "b-r2", "c-r2", "a-r2", "c-r3", "a-r3", "b-r3"]
    assert names[9:12] == ["c-r4", "b-r4", "a-r4"]  # the mirrored half of the design
    assert names[18:] == ["a-r7", "b-r7", "c-r7"]  # the cycle of 6 orders starts again
    for n in range(1, 8):
        orders = round_orders(n)
        assert len(orders) == (2 * n if n % 2 else n) and all(sorted(o) == list(range(n)) for o in orders)
        positions = Counter((v, p) for o in orders for p, v in enumerate(o))
        assert set(positions.values()) == {len(orders) // n}
        follows = Counter(pair for o in orders for pair in pairwise(o))
        assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1
