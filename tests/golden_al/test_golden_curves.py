"""Bundled curves against the published table (REFERENCE.md, transcribed here), lookups and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from golden_al import Curve, CurveError, list_curves, load_curve

ON, OFF = "thinking_on", "thinking_off"

# (file, model key, method, mode) -> AL at k = 1..8, from REFERENCE.md (InferenceX
# golden_al_distribution/, commit 843c625, 2026-08-21).
PUBLISHED = {
    ("dsv4_mtp", "deepseek-v4-pro", "MTP", ON): [1.79, 2.27, 2.49, 2.54, 2.55, 2.55, 2.54, 2.58],
    ("dsv4_mtp", "deepseek-v4-pro", "MTP", OFF): [1.92, 2.61, 2.97, 3.00, 3.10, 3.16, 3.00, 3.11],
    ("dsv4-pro-0813-dspark", "deepseek-v4-pro-0813", "DSpark, probabilistic draft sampling", ON): [1.84, 2.51, 3.01, 3.36, 3.61, 3.77, 3.73, 3.47],
    ("glm5.2_mtp", "glm-5.2-fp8", "MTP", ON): [1.84, 2.50, 2.99, 3.33, 3.61, 3.78, 3.91, 4.06],
    ("qwen3.5_mtp", "qwen3.5-397b-a17b-nvfp4", "MTP", ON): [1.93, 2.73, 3.39, 3.97, 4.41, 4.80, 5.04, 5.21],
    ("qwen3.5_mtp", "qwen3.5-397b-a17b-nvfp4", "MTP", OFF): [1.92, 2.70, 3.33, 3.83, 4.20, 4.48, 4.73, 4.71],
    ("kimik3_dspark", "kimi-k3", "DSpark", ON): [1.84, 2.45, 2.87, 3.22, 3.44, 3.54, 3.78, 3.88],
    ("kimik3_dspark_probabilistic_sample_method_block_rejection_sample_method", "kimi-k3", "DSpark, probabilistic draft, block rejection", ON): [1.85, 2.51, 3.00, 3.36, 3.62, 3.75, 3.84, 4.00],
    ("kimik2.5_eagle3", "kimi-k2.5-nvfp4", "EAGLE3", ON): [1.83, 2.43, 2.88, 3.24, 3.46, 3.62, 3.71, 3.77],
    ("kimik2.5_eagle3", "kimi-k2.5-nvfp4", "EAGLE3", OFF): [1.80, 2.33, 2.75, 3.06, 3.25, 3.43, 3.46, 3.51],
    ("minimaxm3_eagle3", "minimax-m3", "EAGLE3", ON): [1.78, 2.38, 2.83, 3.11, 3.35, 3.45, 3.53, 3.74],
    ("minimaxm3_eagle3", "minimax-m3", "EAGLE3", OFF): [1.84, 2.52, 2.93, 3.41, 3.59, 3.57, 3.85, 4.06],
    ("minimaxm3_eagle3_gqa", "minimax-m3", "EAGLE3, GQA draft head", ON): [1.79, 2.39, 2.78, 3.02, 3.21, 3.30, 3.52, 3.51],
    ("minimaxm3_eagle3_gqa", "minimax-m3", "EAGLE3, GQA draft head", OFF): [1.83, 2.46, 2.97, 3.29, 3.72, 3.76, 3.75, 3.93],
}


def _expected_modes() -> dict[str, dict[str, dict[int, float]]]:
    expected: dict[str, dict[str, dict[int, float]]] = {"dsv41flash_dspark": {ON: {5: 3.51}}}
    for (name, _, _, mode), values in PUBLISHED.items():
        expected.setdefault(name, {})[mode] = dict(enumerate(values, start=1))
    return expected


def test_bundled_names_are_exactly_the_published_files():
    assert list_curves() == sorted(_expected_modes())


@pytest.mark.parametrize("name", sorted(_expected_modes()))
def test_every_bundled_value_matches_the_published_table_and_nothing_else(name):
    # Equality of whole mappings: a missing k or an invented extra k/mode fails too.
    assert load_curve(name).modes == _expected_modes()[name]


@pytest.mark.parametrize(("key", "values"), PUBLISHED.items(), ids=lambda p: str(p))
def test_model_key_method_and_lookup(key, values):
    name, model_key, method, mode = key
    curve = load_curve(name)
    assert (curve.model_key, curve.method) == (model_key, method)
    for k, al in enumerate(values, start=1):
        assert curve.al(k, thinking=mode == ON) == al
        assert curve.has(k, thinking=mode == ON)


def test_every_file_states_source_dataset_and_method():
    for name in list_curves():
        provenance = load_curve(name).provenance
        assert {"source", "dataset", "method"} <= provenance.keys(), name
        assert "SemiAnalysis InferenceX" in provenance["source"]


def test_dsv41_flash_has_only_the_published_point():
    curve = load_curve("dsv41flash_dspark")
    assert curve.model_key == "deepseek-v4.1-flash"
    assert curve.al(5, thinking=True) == 3.51
    assert not curve.has(4, thinking=True)
    assert not curve.has(5, thinking=False)
    with pytest.raises(CurveError, match=r"thinking_off AL at k=5.*thinking_on k=5"):
        curve.al(5, thinking=False)
    with pytest.raises(CurveError, match=r"thinking_on AL at k=3"):
        curve.al(3, thinking=True)


def test_missing_k_lists_what_exists():
    with pytest.raises(CurveError, match=r"glm5.2_mtp.*no thinking_off AL at k=2.*thinking_on k=1\.\.8"):
        load_curve("glm5.2_mtp").al(2, thinking=False)
    with pytest.raises(CurveError, match=r"no thinking_on AL at k=9"):
        load_curve("dsv4_mtp").al(9, thinking=True)


def test_unknown_name_is_an_error_naming_it():
    with pytest.raises(CurveError, match=r"unknown curve 'llama9_mtp'.*dsv4_mtp"):
        load_curve("llama9_mtp")


def test_missing_file_path_is_an_error(tmp_path):
    with pytest.raises(CurveError, match="does not exist"):
        load_curve(str(tmp_path / "nope.yaml"))
    with pytest.raises(CurveError, match=r"curve file .*nope\.yaml does not exist"):
        load_curve(f"{tmp_path / 'nope.yaml'}:some-model")


def _write(tmp_path: Path, text: str, name: str = "mine.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_curve_from_a_file_path(tmp_path):
    path = _write(tmp_path, "# method: MTP\nmy-model:\n  thinking_off: {2: 2.5, 1: 1.5}\n", "my_curve.yml")
    curve = load_curve(path)
    assert isinstance(curve, Curve)
    assert (curve.name, curve.model_key, curve.method) == ("my_curve", "my-model", "MTP")
    assert curve.source == Path(path)
    assert curve.modes == {OFF: {1: 1.5, 2: 2.5}}
    assert curve.al(2, thinking=False) == 2.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m:\n  thinking_on: {1: 1.5\n", r"malformed YAML"),
        ("- 1\n- 2\n", r"expected a mapping of model keys to curves"),
        ("a:\n  thinking_on: {1: 1.5}\nb:\n  thinking_on: {1: 1.5}\n", r"holds several models \(a, b\)"),
        ("_metadata: {draft-model: x}\n", r"at least one top-level model key"),
        ("m:\n  thinking_on: {1: N/A, 2: N/A}\n", r"m\.thinking_on: no measured AL"),
        ("m:\n  - {1: 1.5, 2: 2.0}\n", r"m\[0\]: expected a single-key"),
        ("m:\n  - {1: 1.5}\n  - {1: 1.6}\n", r"m\[1\]: k=1 appears twice"),
        ("m: {1: 2.5}\n", r"m\.1: AL 2\.5 outside \[1, 2\]"),
        ("m:\n  thinking_on: {1: n/a}\n", r"m\.thinking_on\.1: AL must be a number or N/A"),
        ("m: 3\n", r"m: expected a mapping"),
        ("m:\n  thinking_maybe: {1: 1.5}\n", r"m\.thinking_maybe: unknown mode"),
        ("m:\n  thinking_on: {}\n", r"m\.thinking_on: expected a non-empty mapping"),
        ("m:\n  thinking_on: {1: 2.5}\n", r"m\.thinking_on\.1: AL 2\.5 outside \[1, 2\]"),
        ("m:\n  thinking_on: {3: 0.9}\n", r"m\.thinking_on\.3: AL 0\.9 outside \[1, 4\]"),
        ("m:\n  thinking_on: {2: .nan}\n", r"m\.thinking_on\.2: AL nan outside"),
        ("m:\n  thinking_on: {1.5: 1.2}\n", r"m\.thinking_on\.1\.5: k must be an integer"),
        ("m:\n  thinking_on: {'2': 1.2}\n", r"m\.thinking_on\.2: k must be an integer"),
        ("m:\n  thinking_on: {0: 1.0}\n", r"m\.thinking_on\.0: k must be an integer >= 1"),
        ("m:\n  thinking_on: {1: fast}\n", r"m\.thinking_on\.1: AL must be a number"),
    ],
)
def test_malformed_file_is_a_curve_error_naming_file_and_key(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(CurveError, match=message) as raised:
        load_curve(path)
    assert path in str(raised.value)
    assert isinstance(raised.value, ValueError)


FIXTURES = Path(__file__).with_name("fixtures")


def test_upstream_file_with_run_header_metadata_and_na_cells_loads():
    curve = load_curve(str(FIXTURES / "upstream_matrix_na.yaml"))
    assert (curve.name, curve.model_key) == ("upstream_matrix_na", "test-model")
    assert curve.modes == {ON: {1: 1.80, 3: 2.70}, OFF: {1: 1.75, 2: 2.40}}
    assert curve.not_measured == {ON: [2], OFF: [3]}
    assert curve.provenance["source"] == "https://github.com/example/collector/actions/runs/123"
    assert curve.provenance["dataset"].startswith("coding")
    assert curve.provenance["draft-model"] == "example/test-model-draft"
    with pytest.raises(CurveError, match=r"no thinking_on AL at k=2"):
        curve.al(2, thinking=True)  # N/A is absent, never a number


def test_several_models_in_one_file_in_flat_plain_and_matrix_forms():
    path = FIXTURES / "reference_several_models.yaml"
    with pytest.raises(CurveError, match=r"holds several models \(flat-model, plain-model, matrix-model\)"):
        load_curve(str(path))
    flat = load_curve(f"{path}:flat-model")
    assert flat.name == "reference_several_models:flat-model"
    assert flat.modes == {"any": {1: 1.90, 2: 2.60}} and flat.not_measured == {"any": [3]}
    assert flat.al(2, thinking=True) == flat.al(2, thinking=False) == 2.60  # one curve for every mode
    assert load_curve(f"{path}:plain-model").al(1, thinking=False) == 1.70
    matrix = load_curve(f"{path}:matrix-model")
    assert matrix.al(2, thinking=True) == 2.50 and not matrix.has(2, thinking=False)
    with pytest.raises(CurveError, match=r"no model 'other'; it has: flat-model, plain-model, matrix-model"):
        load_curve(f"{path}:other")


def test_selection_by_model_prefix_and_key_as_inferencex():
    curve = load_curve("dsv4")  # InferenceX's prefix table: dsv4 -> deepseek-v4-pro
    assert (curve.name, curve.model_key, curve.selected_by) == ("dsv4_mtp", "deepseek-v4-pro", "model")
    assert curve.al(3, thinking=True) == 2.49
    assert load_curve("dsv4dspark").name == "dsv4-pro-0813-dspark"
    assert load_curve("qwen3.5-397b-a17b-nvfp4").name == "qwen3.5_mtp"  # any other prefix is the key itself
    assert load_curve("dsv4_mtp").selected_by == "name"
    with pytest.raises(CurveError, match=r"model 'minimax-m3' has several bundled curves \(minimaxm3_eagle3, "
                                         r"minimaxm3_eagle3_gqa\); name one"):
        load_curve("minimax-m3")


def test_an_upstream_file_dropped_into_the_data_folder_is_bundled(tmp_path, monkeypatch):
    import shutil

    import golden_al.curves as curves

    for path in curves.DATA_DIR.glob("*.yaml"):
        shutil.copy(path, tmp_path)
    shutil.copy(FIXTURES / "upstream_matrix_na.yaml", tmp_path / "testmodel_mtp.yaml")
    monkeypatch.setattr(curves, "DATA_DIR", tmp_path)
    assert "testmodel_mtp" in curves.list_curves()
    assert curves.load_curve("testmodel_mtp").al(3, thinking=True) == 2.70
    assert curves.load_curve("test-model").name == "testmodel_mtp"
    assert {c.model_key for c in curves.bundled_curves()} >= {"test-model", "deepseek-v4-pro"}
