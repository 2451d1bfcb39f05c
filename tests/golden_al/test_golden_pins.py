"""InferenceX's fixed acceptance lengths (golden_al/infx_pins.yaml): every model prefix whose launch
scripts speculate selects the curve those scripts cite, and the AL each script pins at its draft
length is what that bundled curve says; `golden-al select` and `golden-al pins` through the CLI."""

from __future__ import annotations

import json

import pytest

from golden_al.curves import CurveError, select_by_model
from golden_al.pins import Draft, Pin, find_pin, head, pins
from loadgen.cli import main

# model prefix, draft length, the AL InferenceX's scripts pin (thinking on), the curve they cite
FAMILIES = [
    ("qwen3.5", 3, 3.39, "qwen3.5_mtp"),
    ("glm5.2", 3, 2.99, "glm5.2_mtp"),
    ("glm5.2", 5, 3.61, "glm5.2_mtp"),
    ("kimik3", 7, 3.84, "kimik3_dspark_probabilistic_sample_method_block_rejection_sample_method"),
    ("kimik3", 2, 2.51, "kimik3_dspark_probabilistic_sample_method_block_rejection_sample_method"),
    ("minimaxm3", 3, 2.78, "minimaxm3_eagle3_gqa"),
    ("kimik2.5", 3, 2.88, "kimik2.5_eagle3"),
    ("dsv4", 3, 2.49, "dsv4_mtp"),
]


def test_every_pinned_al_is_the_bundled_curve_at_its_draft_length():
    assert len(pins()) == 33
    for pin in pins():
        curve = select_by_model(pin.prefix)
        assert curve.selected_by == "model"
        for band in pin.drafts:
            assert curve.al(band.k, thinking=True) == band.al, (pin.script, band)


@pytest.mark.parametrize(("prefix", "k", "al", "curve"), FAMILIES)
def test_each_family_prefix_selects_the_curve_its_scripts_cite(prefix, k, al, curve, capsys):
    assert select_by_model(prefix).name == curve
    assert main(["golden-al", "select", prefix, "--spec-k", str(k), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["curve"], shown["al"], shown["thinking"]) == (curve, al, "on")


def test_a_script_picks_its_draft_length_by_concurrency():
    b300 = find_pin("kimik3", "fp4", "b300", "vllm")
    assert b300 is not None and b300.script == "kimik3_fp4_b300_vllm_mtp"
    assert [b300.draft(c) for c in (1, 8, 9, 16, 17)] == [Draft(7, 3.84, 8)] * 2 + [Draft(3, 3.0, 16)] * 2 + [None]
    assert b300.describe() == "conc <= 8: k=7 (AL 3.84); conc <= 16: k=3 (AL 3); higher: no drafts"
    atom = find_pin("kimik3", "fp4", "mi355x", "atom")
    assert atom is not None and [atom.draft(c).k for c in (1, 2, 64)] == [6, 2, 2]
    assert find_pin("qwen3.5", "fp8", "h200", "sglang") == Pin(
        "qwen3.5_fp8_h200_mtp", "qwen3.5", "fp8", "h200", "sglang", (Draft(3, 3.39),))
    assert find_pin("qwen3.5", "fp8", "h200", "vllm") is None


def test_draft_heads_of_the_vllm_scripts():
    assert head("minimaxm3").model == "Inferact/MiniMax-M3-EAGLE3-GQA" and head("minimaxm3").method == "eagle3"
    assert head("kimik3").method == "dspark" and head("dsv4").model is None
    assert head("qwen3.5") is None  # its built-in MTP head


def test_two_curves_of_one_model_stay_ambiguous_by_model_key():
    with pytest.raises(CurveError, match="model 'kimi-k3' has several bundled curves"):
        select_by_model("kimi-k3")


def test_pins_lists_each_script_against_its_curve(capsys):
    assert main(["golden-al", "pins", "minimaxm3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 9 and all(row["curve_agrees"] and row["curve"] == "minimaxm3_eagle3_gqa" for row in rows)
    assert main(["golden-al", "pins"]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()[2:]
    assert len(lines) == 33 and all(line.endswith("yes") for line in lines)
    assert "kimik3_fp4_b300_vllm_mtp" in table and "conc <= 8: k=7 (AL 3.84)" in table
    assert main(["golden-al", "pins", "gptoss"]) == 2
    assert "no InferenceX launch script pins a draft length for 'gptoss'" in capsys.readouterr().err
