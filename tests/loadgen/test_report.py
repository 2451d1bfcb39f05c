"""`loadgen report` on results of the real replay pipeline: terminal table, CSV, InferenceX keys,
PNG plots, self-contained HTML with its timelines' data (test_report_browser.py draws them), several files at
once, failed levels, bad input."""

from __future__ import annotations

import base64
import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from loadgen.cli import main
from loadgen.report import timeline
from loadgen.results.file import write_results
from loadgen.results.turns import turn_summary

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = ("tput_vs_interactivity.png", "tput_vs_e2el.png", "tput_vs_e2e_interactivity.png", "ttft_percentiles.png",
         "e2el_percentiles.png", "ttft_vs_context.png")
SESSION_TURNS = {f"s{i}": 2 for i in range(8)}  # the sweeps' sessions: 2 parent requests each
_RUNS: dict[str, Path] = {}  # two sweeps shared by the tests of this module


@pytest.fixture
def runs(start_server, sessions, replay, tmp_path_factory) -> dict[str, Path]:
    """fast and slow sweeps (`--conc 1,3`), a copy of fast whose conc 3 level failed, and one as
    results of earlier versions hold it (no `turns`, `slo`, nor `agent` and `start_ms` columns)."""
    if _RUNS:
        return _RUNS
    folder = sessions(*({"n_requests": 2, "think": 0.0, "n_out": 5 + i % 4} for i in range(8)))
    out = tmp_path_factory.mktemp("report")
    flags = ("--traces", str(folder), "--conc", "1,3", "--duration", "1.2")
    for name, itl_ms in (("fast", 5.0), ("slow", 12.0)):
        server = start_server(first_ms=20, itl_ms=itl_ms)
        code, doc, _ = replay(server.url, *flags)
        assert code == 0
        for level in doc["levels"]:  # what replay writes once the level summary holds it
            level.setdefault("turns", turn_summary(level["requests"], session_turns=SESSION_TURNS))
        _RUNS[name] = write_results(out / name / "result.json", doc)
        if name == "fast":
            doc["levels"][1].update(failed=True, fail_reasons=["error rate 50.0% > --max-error-rate 10.0%"])
            _RUNS["failed"] = write_results(out / "failed.json", doc)
            _RUNS["old"] = write_results(out / "old.json", _older(doc))
    return _RUNS


def _older(doc: dict) -> dict:
    """`doc` as an earlier version wrote it: no `turns` or `slo`, no `agent` or `start_ms` column."""
    doc = json.loads(json.dumps(doc))
    for level in doc["levels"]:
        level.pop("turns", None)
        level.pop("slo", None)
        del level["requests"]["agent"], level["requests"]["start_ms"]
    return doc


def _report(capsys, *args) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_terminal_table_has_every_level_and_the_sweep_summary(runs, capsys):
    code, out, _ = _report(capsys, runs["fast"], runs["slow"].parent)  # a folder holding result.json works too
    assert code == 0
    assert out.count("== conc 1:") == 2 and out.count("== conc 3:") == 2
    assert "# fast (" in out and "# slow (" in out  # a folder's result.json is named by its folder
    summary = out[out.index("== sweep summary"):out.index("\n\n== Pareto evidence per curve")].splitlines()
    assert len(summary) == 2 + 4  # title, header, one row per level per file
    # p90 interactivity = 1 / p90(TPOT) is the slow tail (docs/results_schema.md) and is labelled so
    assert "slow-tail intvty p90 (tok/s)" in summary[1]
    assert len({len(line) for line in summary[1:]}) == 1  # right-aligned columns: equal line widths
    rows = {tuple(line.split()[:3]) for line in summary[2:]}
    assert rows == {("fast", "conc", "1"), ("fast", "conc", "3"), ("slow", "conc", "1"), ("slow", "conc", "3")}
    # the fast server at conc 3 has the most throughput and beats both slow levels on every axis
    marks = {tuple(line.split()[:3]): re.search(r"\s([IEN]+)$", line) for line in summary[2:]}
    assert marks[("fast", "conc", "3")].group(1) == "IEN"
    assert marks[("slow", "conc", "1")] is None and marks[("slow", "conc", "3")] is None


def test_the_report_gives_the_pareto_evidence_of_each_curve(runs, capsys, tmp_path):
    """The review's evidence, as `recipe verify` computes it: a file without a recipe fingerprint is a curve."""
    code, out, _ = _report(capsys, runs["fast"], runs["failed"], "--format", "table,html", "--out", tmp_path)
    assert code == 0
    evidence = out[out.index("== Pareto evidence per curve"):]
    fast = re.search(rf"curve of {re.escape(str(runs['fast']))} \(fast\): 2 points measured \(conc 1, conc 3; 1 run\), "
                     r"0 invalid, [12] on the frontier.*\n  2 valid points: the review recommends 5 or more", evidence)
    failed = re.search(rf"curve of {re.escape(str(runs['failed']))} \(\S+\): 2 points measured .*1 invalid \(conc 3\), "
                       r"1 on the frontier \(conc 1\)\n  1 valid point: the review recommends 5", evidence)
    assert fast and failed, evidence
    html = (tmp_path / "report.html").read_text()
    assert "<h2>Pareto evidence per curve</h2>" in html and "1 invalid (conc 3)" in html


def test_mooncake_levels_are_points_of_their_curve(runs, capsys, tmp_path):
    doc = json.loads(runs["fast"].read_text())
    for level, label in zip(doc["levels"], ("mooncake x2", "mooncake")):
        level.update(mode="mooncake", concurrency=None, rate=None, label=label)
    code, out, _ = _report(capsys, write_results(tmp_path / "mooncake" / "result.json", doc))
    assert code == 0 and "2 points measured (mooncake, mooncake x2; 1 run)" in out


def test_replay_writes_every_frontier_into_the_results_file(runs):
    pareto = json.loads(runs["fast"].read_text())["pareto"]
    assert [p["label"] for p in pareto["points"]] == ["conc 1", "conc 3"]
    assert 1 in pareto["tput_per_gpu_vs_e2e_interactivity"]  # the most throughput is never dominated
    for axis in ("tput_per_gpu_vs_interactivity_p50", "tput_per_gpu_vs_e2el_p90"):
        assert set(pareto[axis]) <= set(pareto["tput_per_gpu_vs_e2e_interactivity"])


def test_failed_levels_are_marked_and_never_on_a_frontier(runs, capsys):
    code, out, _ = _report(capsys, runs["failed"], "--format", "table")
    assert code == 0
    summary = out[out.index("== sweep summary"):out.index("\n\n== Pareto evidence per curve")].splitlines()[2:]
    assert summary[1].split()[:3] == ["failed", "conc", "3"] and summary[1].endswith("FAILED")
    assert "FAILED: error rate 50.0%" in out


def test_csv_has_one_row_per_level_per_file(runs, capsys, tmp_path):
    code, out, _ = _report(capsys, runs["fast"], runs["slow"], "--format", "csv", "--out", tmp_path)
    assert code == 0 and f"wrote {tmp_path / 'levels.csv'}" in out
    with open(tmp_path / "levels.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["run"], r["label"]) for r in rows] == [("fast", "conc 1"), ("fast", "conc 3"), ("slow", "conc 1"),
                                                     ("slow", "conc 3")]
    for key in ("output_tokens_per_s_per_gpu", "ttft_p90_us", "e2el_p99_us", "interactivity_p50_tok_s", "tpot_count",
                "on_frontier_interactivity", "on_frontier_e2el", "on_frontier_e2e_interactivity"):
        assert key in rows[0], key
    doc = json.loads(runs["fast"].read_text())
    assert float(rows[0]["ttft_p90_us"]) == doc["levels"][0]["metrics"]["ttft"]["stats"]["p90"]
    assert int(rows[0]["requests_ok"]) == doc["levels"][0]["counts"]["requests_ok"]
    assert {r["on_frontier_e2e_interactivity"] for r in rows if r["run"] == "slow"} == {"False"}


def test_infx_export_uses_inferencex_keys_and_units(runs, capsys, tmp_path):
    identity = ("--hw", "h200", "--framework", "vllm", "--precision", "fp8", "--model-prefix", "dsv4",
                "--isl", "200", "--osl", "6")
    code, _, _ = _report(capsys, runs["fast"], "--format", "infx", "--out", tmp_path, *identity)
    assert code == 0
    entries = json.loads((tmp_path / "infx.json").read_text())
    assert [e["conc"] for e in entries] == [1, 3]
    level = json.loads(runs["fast"].read_text())["levels"][0]
    entry = entries[0]
    for key in ("tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu", "median_ttft", "p90_ttft", "p99_ttft",
                "mean_ttft", "std_ttft", "median_tpot", "p90_tpot", "median_intvty", "p90_intvty", "p99_intvty",
                "mean_intvty", "median_e2el", "p90_e2el", "p99_e2el", "median_itl", "p99.9_e2el"):
        assert entry[key] is not None, key
    columns = level["requests"]
    assert entry["median_ttft"] == pytest.approx(np.percentile(columns["ttft_us"], 50) / 1e6)  # seconds
    assert 0.02 <= entry["median_ttft"] < 1.0  # the server waits 20 ms before the first token
    assert entry["p90_e2el"] == pytest.approx(np.percentile(columns["e2el_us"], 90) / 1e6)
    assert entry["p90_intvty"] == pytest.approx(1 / entry["p90_tpot"])  # tok/s from the TPOT statistic
    assert entry["mean_intvty"] == pytest.approx(1 / entry["mean_tpot"])
    starts = np.asarray(columns["start_ms"]) / 1e3  # InferenceX's span, max(end) - min(start), not our window
    span = (starts + np.asarray(columns["e2el_us"]) / 1e6).max() - starts.min()
    assert entry["tput_per_gpu"] == pytest.approx((sum(columns["isl"]) + sum(columns["osl"])) / span)
    assert entry["output_tput_per_gpu"] == pytest.approx(sum(columns["osl"]) / span)
    assert (entry["tp"], entry["isl"], entry["osl"]) == (1, 200, 6)


def test_every_plot_is_a_png(runs, capsys, tmp_path):
    code, out, _ = _report(capsys, runs["fast"], runs["slow"], runs["failed"], "--format", "png", "--out", tmp_path)
    assert code == 0
    for name in PLOTS:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name
        assert f"wrote {tmp_path / name}" in out


def test_html_is_self_contained_with_embedded_images(runs, capsys, tmp_path):
    code, _, _ = _report(capsys, runs["fast"], runs["slow"], "--format", "html", "--out", tmp_path)
    assert code == 0
    html = (tmp_path / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == len(PLOTS)
    assert all(base64.b64decode(image).startswith(PNG_SIGNATURE) for image in images)
    assert html.count('src="') == len(PLOTS)  # nothing else is loaded
    for external in ("href=", "<link", "url(", "@import", "fetch(", "XMLHttpRequest"):
        assert external not in html, external
    # the scripts are inline: uPlot and the timeline code, then one data block per level
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts == ['<script type="application/json" class="tl-data" data-target="timeline-0-0">',
                       '<script type="application/json" class="tl-data" data-target="timeline-0-1">',
                       '<script type="application/json" class="tl-data" data-target="timeline-1-0">',
                       '<script type="application/json" class="tl-data" data-target="timeline-1-1">',
                       "<script>", "<script>"]
    assert "Sweep summary" in html and html.count("<h3>conc 1</h3>") == 2
    assert "TTFT" in html and "interactivity (slow tail)" in html and "slow-tail intvty p90 (tok/s)" in html
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # plots only embedded


def test_format_all_writes_everything(runs, capsys, tmp_path):
    code, out, _ = _report(capsys, runs["fast"], "--format", "all", "--out", tmp_path / "all")
    assert code == 0 and "== sweep summary" in out
    # the InferenceX shapes need the run's identity, so `all` leaves them to be asked for by name
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == sorted(["levels.csv", "report.html", *PLOTS])


def test_default_out_is_beside_the_first_results_file(runs, capsys):
    code, out, _ = _report(capsys, runs["fast"], "--format", "csv")
    assert code == 0
    assert (runs["fast"].parent / "report" / "levels.csv").exists()


def test_bad_input_exits_2_naming_the_file(runs, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "agentload.result/0", "status": "complete", "config": {}, "levels": []}))
    truncated = json.loads(runs["fast"].read_text())
    del truncated["levels"][0]["requests"]["ttft_us"]
    broken = write_results(tmp_path / "broken.json", truncated)
    cases = [
        ((tmp_path / "missing.json",), "missing.json: cannot read"),
        ((runs["fast"], bad), "bad.json: not valid JSON"),
        ((wrong,), "wrong.json: schema: expected 'agentload.result/1'"),
        ((broken,), "broken.json: levels[0].requests.ttft_us"),
        ((runs["fast"], "--format", "pdf"), "--format: unknown format pdf"),
    ]
    for args, message in cases:
        code, _, err = _report(capsys, *args)
        assert code == 2, (args, err)
        assert message in err, (args, err)


def _slo_entry(name: str, bounds: str, target: float, requests: tuple, sessions: tuple, goodput: tuple,
               violations: dict, worst: str | None) -> dict:
    """A level's `slo` entry (docs/results_schema.md): requests and sessions as (total, good,
    attainment, interval, met), goodput as (req/s, output tok/s, output tok/s/GPU)."""
    def part(total, good, attainment, interval):
        return {"total": total, "good": good, "attainment": attainment, "interval": interval}

    return {"name": name, "spec": bounds, "target": target,
            "requests": {**part(*requests[:4]), "met": requests[4]}, "sessions": part(*sessions[:4]),
            "goodput": dict(zip(("requests_per_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu"), goodput)),
            "violations": violations, "worst": worst}


SLOS = [
    _slo_entry("standard", "ttft<=5s,interactivity>=20", 0.95, (1000, 971, 0.971, [0.95, 0.983], True),
               (50, 44, 0.88, [0.701, 0.96], None), (1.23, 912.0, 456.7),
               {"ttft<=5s": 12, "interactivity>=20": 3, "error": 0}, "ttft<=5s"),
    _slo_entry("<tight>", "ttft<=100ms", 0.99, (200, 197, 0.985, [0.97, 0.995], None), (0, 0, None, None, None),
               (0.5, 10.0, 10.0), {"ttft<=100ms": 0, "error": 0}, None),
    _slo_entry("strict", "e2el<=1s", 0.9, (10, 5, 0.5, [0.2, 0.8], False), (2, 1, 0.5, [0.1, 0.9], None),
               (0.25, 2.0, 1.0), {"e2el<=1s": 3, "error": 5}, "error"),
]
SLO_LINES = [
    "   SLO standard (ttft<=5s, interactivity>=20): 97.1 % of requests [95.0, 98.3] (target 95 %: met), 88.0 % of "
    "sessions [70.1, 96.0]; goodput 1.23 req/s, 456.7 output tok/s/GPU; most violated: ttft<=5s (12)",
    "   SLO <tight> (ttft<=100ms): 98.5 % of requests [97.0, 99.5] (target 99 %: undecided), n/a of sessions; "
    "goodput 0.50 req/s, 10.0 output tok/s/GPU; most violated: none",
    "   SLO strict (e2el<=1s): 50.0 % of requests [20.0, 80.0] (target 90 %: not met), 50.0 % of sessions "
    "[10.0, 90.0]; goodput 0.25 req/s, 1.0 output tok/s/GPU; most violated: error (5)",
]


def test_table_has_the_slo_lines_the_latencies_by_context_and_the_sessions(runs, capsys, tmp_path):
    doc = json.loads(runs["fast"].read_text())
    doc["levels"][0]["slo"] = SLOS
    code, out, _ = _report(capsys, write_results(tmp_path / "slo.json", doc))
    assert code == 0
    first = out[out.index("== conc 1:"):out.index("== conc 3:")]
    lines = first.splitlines()
    assert [line for line in lines if line.startswith("   SLO ")] == SLO_LINES
    level = doc["levels"][0]
    columns = level["requests"]
    header = lines.index("   context (tokens)    requests  TTFT p50 (ms)  TTFT p90 (ms)  TPOT p50 (ms)   E2EL p90 (s)")
    # every prompt of the sweeps' sessions is under 1k tokens: one bucket holding every request
    cells = lines[header + 1].split()
    assert cells[:2] == ["<1k", str(level["counts"]["requests_ok"])]
    ttft_p50 = np.percentile(columns["ttft_us"], 50, method="inverted_cdf") / 1000  # nearest rank
    e2el_p90 = np.percentile(columns["e2el_us"], 90, method="inverted_cdf") / 1e6
    assert (float(cells[2]), float(cells[5])) == (round(ttft_p50, 3), round(e2el_p90, 3))
    # a play is whole when both of its session's requests were measured
    plays = sorted(set(columns["play"]))
    whole = sum(sorted(t for p, t in zip(columns["play"], columns["turn"]) if p == play) == [0, 1] for play in plays)
    assert lines[header + 2].startswith(f"   sessions: {len(plays)} plays measured, {whole} whole; wall time p50 ")
    assert "; good share mean " in lines[header + 2]  # against the first SLO (a replay's default: the tiers)


def test_html_has_the_slo_table_the_breakdowns_and_their_definitions(runs, capsys, tmp_path):
    doc = json.loads(runs["fast"].read_text())
    doc["levels"][0]["slo"], doc["levels"][1]["slo"] = SLOS, []
    code, _, _ = _report(capsys, write_results(tmp_path / "slo.json", doc), "--format", "html", "--out", tmp_path)
    assert code == 0
    html = (tmp_path / "report.html").read_text()
    assert "<td>97.1 % [95.0, 98.3] (target 95 %: met)</td><td>88.0 % [70.1, 96.0]</td>" in html
    assert "<td>&lt;tight&gt;</td><td>ttft&lt;=100ms</td>" in html and "<tight>" not in html
    assert "<td>1.23 req/s, 456.7 output tok/s/GPU</td><td>ttft&lt;=5s (12)</td>" in html
    assert html.count("<h4>SLO</h4>") == 1  # none for a level without SLOs
    assert html.count("<h4>by context</h4>") == html.count("<h4>by turn (parent requests)</h4>") == 2
    requests = [level["counts"]["requests_ok"] for level in doc["levels"]]
    for ok in requests:  # every request under 1k tokens, every one a parent's turn 0 or 1
        assert f"<td>&lt;1k</td><td>{ok}</td>" in html and f"<td>0-1</td><td>{ok}</td>" in html
    assert html.count("<p>sessions: ") == 2
    for name in ("SLO", "attainment", "goodput", "turn", "context bucket"):
        assert f"<li><b>{name}</b>: " in html, name


def test_results_of_earlier_versions_still_render(runs, capsys, tmp_path):
    code, out, _ = _report(capsys, runs["old"], "--format", "table,png,html", "--out", tmp_path)
    assert code == 0
    assert "== conc 1:" in out and "context (tokens)" not in out and "   SLO " not in out
    assert not (tmp_path / "ttft_vs_context.png").exists()  # no level has per-context rows
    html = (tmp_path / "report.html").read_text()
    assert "<h4>by context</h4>" not in html and "<h4>SLO</h4>" not in html
    assert html.count("No timeline: the requests have no start times") == 2 and "<script" not in html
    # turns computed from such columns: by context, no by turn (parents unknown), no wall times
    doc = json.loads(runs["old"].read_text())
    for level in doc["levels"]:
        level["turns"] = turn_summary(level["requests"], session_turns=SESSION_TURNS)
    code, out, _ = _report(capsys, write_results(tmp_path / "old_turns.json", doc), "--format", "table,html",
                           "--out", tmp_path)
    assert code == 0
    plays = len(set(doc["levels"][0]["requests"]["play"]))
    assert f"   sessions: {plays} plays measured\n" in out  # neither whole flags nor wall times
    html = (tmp_path / "report.html").read_text()
    assert html.count("<h4>by context</h4>") == 2 and "<h4>by turn" not in html


EVIL = "s</script><script>alert(1)</script>"
TL_DATA = re.compile(r'<script type="application/json" class="tl-data" data-target="[^"]+">(.*?)</script>')


def test_html_embeds_each_levels_timeline_safely(runs, capsys, tmp_path):
    doc = json.loads(runs["fast"].read_text())
    level = doc["levels"][0]
    level["requests"]["session"][0] = EVIL
    level["gpu"] = {"series": {"t_s": [-0.5, 0.5, 1.5], "power_w": {"0": [300.0, 410.5, None], "1": [290.0, 400.0,
                                                                                                    405.0]}}}
    code, _, _ = _report(capsys, write_results(tmp_path / "evil.json", doc), "--format", "html", "--out", tmp_path)
    assert code == 0
    html = (tmp_path / "report.html").read_text()
    assert "alert(1)</script>" not in html  # escaped inside the data block, so it cannot end it
    first, second = [json.loads(block) for block in TL_DATA.findall(html)]
    assert EVIL in {lane["session"] for lane in first["lanes"]}  # JSON.parse reads the escapes back
    # every request of these small levels is drawn, on a lane of its play's session, times in ms
    columns = level["requests"]
    bars = first["bars"]
    assert len(bars["lane"]) == len(columns["play"]) == level["counts"]["requests_ok"]
    assert sorted(bars["e2el"]) == sorted(round(e / 1e3, 1) for e in columns["e2el_us"])
    lanes = [first["lanes"][lane] for lane in bars["lane"]]
    assert sorted((lane["play"], lane["session"]) for lane in lanes) == sorted(zip(columns["play"], columns["session"]))
    # the test server has no /metrics: only the GPUs' power, one line per GPU, on the x range it widens
    assert [chart["title"] for chart in first["charts"]] == ["GPU power"]
    assert first["charts"][0]["lines"] == [{"label": "GPU 0", "values": [300.0, 410.5, None]},
                                           {"label": "GPU 1", "values": [290.0, 400.0, 405.0]}]
    assert first["x"][0] == -0.5 and first["x"][1] >= level["window_s"]
    assert second["charts"] == []
    assert html.count("No server series: no scrape of /metrics succeeded (") == 2
    assert f"Lanes: {len(set(columns['play']))} of {len(set(columns['play']))} session plays" in html


def _columns(plays: int, per_play: int) -> dict[str, list]:
    """A level's request columns: `plays` plays one after another, each `per_play` parent requests."""
    n = plays * per_play
    return {"play": [i // per_play for i in range(n)], "session": [f"s{i // per_play}" for i in range(n)],
            "agent": [""] * n, "turn": [i % per_play for i in range(n)], "isl": [100] * n, "osl": [10] * n,
            "ttft_us": [1000] * n, "e2el_us": [5000] * n, "tpot_us": [444] * n,
            "start_ms": [float(i) for i in range(n)]}


@pytest.mark.parametrize(("plays", "per_play", "shown_plays", "shown_requests"), [
    (20_000, 2, timeline.MAX_LANES, 2 * timeline.MAX_LANES),  # many short plays: the lanes are capped
    (10, 1000, timeline.MAX_BARS // 1000, timeline.MAX_BARS),  # a few long ones: the requests are
    (1, 10_000, 1, timeline.MAX_BARS),  # one play longer than the cap: its first requests
])
def test_a_large_level_shows_its_first_plays_within_the_caps(plays, per_play, shown_plays, shown_requests):
    level = {"window_s": 60.0, "requests": _columns(plays, per_play)}
    data, shown = timeline.timeline_data(level, range(plays * per_play))
    assert shown == {"plays": shown_plays, "plays_total": plays, "requests": shown_requests,
                     "requests_total": plays * per_play}
    assert len(data["lanes"]) == shown_plays and len(data["bars"]["start"]) == shown_requests
    assert [lane["play"] for lane in data["lanes"]] == list(range(shown_plays))  # the first by start
    assert len(timeline.embed_json(data)) < 60 * shown_requests + 20_000  # bytes of the page it adds


def test_a_long_series_is_thinned():
    n = 3 * timeline.MAX_POINTS + 1
    series = {"t_s": [i / 10 for i in range(n)], "running": [float(i) for i in range(n)], "waiting": [None] * n}
    level = {"window_s": 60.0, "requests": _columns(1, 1), "server_metrics": {"scrapes": n, "series": series}}
    data, _ = timeline.timeline_data(level, [0])
    requests = data["charts"][0]
    assert requests["title"] == "requests at the server"
    assert requests["t_s"] == [i / 10 for i in range(0, n, 4)] and len(requests["t_s"]) <= timeline.MAX_POINTS
    assert requests["lines"] == [{"label": "running", "values": [float(i) for i in range(0, n, 4)]}]  # no waiting
    assert data["x"] == [0.0, (n - 1) / 10]  # the last reading is kept: the x axis spans them all
