"""The HTML report's timelines in a real browser: the report of a real replay (against sse_server.py, which
serves running/waiting/KV-usage gauges and GPU power on /metrics) opened in headless Chromium through Selenium
must draw every level's swim lanes and server series without a console error. A screenshot of the busier level's
timeline is kept as a test artefact, test-artifacts/report-timeline.png at the repository's root.

Debian's chromium and chromium-driver run it; where they are missing the tests skip, unless
AGENTLOAD_REQUIRE_BROWSER is set (.ci/run sets it and installs them): then they fail."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.results.file import write_results
from loadgen.run.plan import LanePlays
from traces import load_traces

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
REQUIRE_BROWSER = "AGENTLOAD_REQUIRE_BROWSER"
ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "report-timeline.png"
EVIL = "evil</script><script>alert(1)</script>"  # a session id that must stay text
CHART_TITLES = ["session plays", "requests at the server", "KV-cache usage", "GPU power"]
LINES = ["#3b6fb6", "#e8a33d", "#4c9a5b"]  # timeline.js's first line colours (lines may hide one another)
LOADED_S = 30
_REPORT: dict[str, Path] = {}  # one replay and report for the module's tests


def _browser_or_skip() -> None:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    if not missing:
        return
    message = f"no browser to render the report in: {', '.join(missing)} missing (apt-get install chromium " \
              "chromium-driver)"
    if os.environ.get(REQUIRE_BROWSER):
        pytest.fail(f"{message}, and {REQUIRE_BROWSER} requires it")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", "--window-size=1400,1600"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    yield driver
    driver.quit()


@pytest.fixture
def report(start_server, sessions, replay, tmp_path_factory) -> Path:
    """report.html of two levels (conc 2 and 4) of ten sessions with think time, every third with a subagent,
    one with a session id holding `</script>`, the server's /metrics scraped every 0.1 s."""
    if _REPORT:
        return _REPORT["html"]
    server = start_server(first_ms=40, itl_ms=8, gauges=4000)
    subagent = {"t": 0.2, "n_requests": 3, "think": 0.1, "duration_s": 1.0}
    folder = sessions(*({"n_requests": 6, "think": 0.3, "n_out": 12, "sid": EVIL if i == 4 else f"s{i}",
                         **({"subagent": subagent} if i % 3 == 0 else {})} for i in range(10)))
    # a seed that deals the evil session to the first level's first lane, so its bars are drawn
    traces = load_traces(str(folder)).sessions
    seed = next(s for s in range(1000) if LanePlays(traces, s, 0, 2, (0.25, 0.75)).play(0, 0).session.id == EVIL)
    code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "2,4", "--duration", "2.5", "--warmup",
                          "0.5s", "--server-metrics-interval", "0.1", "--seed", str(seed))
    assert code == 0
    out = tmp_path_factory.mktemp("browser-report")
    assert main(["report", str(write_results(out / "result.json", doc)), "--format", "html", "--out", str(out)]) == 0
    _REPORT["html"] = out / "report.html"
    return _REPORT["html"]


def _embedded(html: str) -> list[dict]:
    """Each level's timeline data as the page embeds it."""
    blocks = re.findall(r'<script type="application/json" class="tl-data" data-target="[^"]+">(.*?)</script>', html)
    return [json.loads(block) for block in blocks]


def _open(browser, path: Path) -> list:
    """Load the report and wait until every timeline has drawn; returns their elements."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(path.as_uri())
    WebDriverWait(browser, LOADED_S).until(lambda b: b.execute_script(
        "return [...document.querySelectorAll('.timeline')].every(e => e.dataset.drawn)"))
    return browser.find_elements("css selector", ".timeline")


# Pixels of a canvas within a small distance of a colour (canvas lines are anti-aliased).
COLOUR_PIXELS = """
const [canvas, hex] = arguments, ctx = canvas.getContext("2d");
const want = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
let n = 0;
for (let i = 0; i < px.length; i += 4) {
  if (Math.abs(px[i] - want[0]) + Math.abs(px[i + 1] - want[1]) + Math.abs(px[i + 2] - want[2]) < 30) n++;
}
return n;
"""


def test_the_timelines_draw_in_headless_chromium(report, browser):
    html = report.read_text()
    data = _embedded(html)
    levels = json.loads((report.parent / "result.json").read_text())["levels"]
    roots = _open(browser, report)
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, severe
    assert len(roots) == len(data) == len(levels) == 2
    for root, level, drawn in zip(roots, levels, data):
        charts = root.find_elements("css selector", ".uplot")
        assert [chart.find_element("css selector", ".u-title").text for chart in charts] == CHART_TITLES
        assert root.get_attribute("data-drawn") == str(len(CHART_TITLES))
        lanes = charts[0]
        # every measured request fits under the caps: one bar each, all drawn
        assert len(drawn["bars"]["lane"]) == level["counts"]["requests_ok"]
        assert lanes.get_attribute("data-bars") == str(level["counts"]["requests_ok"])
        canvas = lanes.find_element("css selector", "canvas")
        for colour in ("#e8a33d", "#3b6fb6"):  # waiting and streaming
            assert browser.execute_script(COLOUR_PIXELS, canvas, colour) > 50, colour
        for chart, lines in zip(charts[1:], (len(c["lines"]) for c in drawn["charts"])):  # each drew its lines
            canvas = chart.find_element("css selector", "canvas")
            assert sum(browser.execute_script(COLOUR_PIXELS, canvas, colour) for colour in LINES[:lines]) > 20
    assert any(lane["agent"] for lane in data[-1]["lanes"])  # subagents have lanes of their own
    ARTIFACT.parent.mkdir(exist_ok=True)
    roots[-1].screenshot(str(ARTIFACT))
    assert ARTIFACT.read_bytes().startswith(b"\x89PNG")


# Where (CSS px from the lanes' plot area's centre) the first bar of the lane whose session is arguments[1] is.
BAR_OFFSET = """
const [root, session] = arguments, u = window.agentloadTimelines[root.id][0];
const d = JSON.parse(document.querySelector(`script.tl-data[data-target="${root.id}"]`).textContent);
const lane = d.lanes.findIndex(l => l.session === session), i = d.bars.lane.indexOf(lane);
const mid = (d.bars.start[i] + d.bars.e2el[i] / 2) / 1e3;
return [u.valToPos(mid, "x") - u.over.clientWidth / 2, u.valToPos(-lane, "y") - u.over.clientHeight / 2];
"""


def test_hovering_a_bar_shows_its_request_and_ids_stay_text(report, browser):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.action_chains import ActionChains

    assert EVIL not in report.read_text()  # only escaped: it cannot end the data block
    root = _open(browser, report)[0]
    with pytest.raises(NoAlertPresentException):  # the id's <script> never ran
        browser.switch_to.alert.accept()
    over = root.find_element("css selector", ".tl-lanes .u-over")
    dx, dy = browser.execute_script(BAR_OFFSET, root, EVIL)
    ActionChains(browser).move_to_element_with_offset(over, round(dx), round(dy)).perform()
    tip = root.find_element("css selector", ".tl-tip")
    assert tip.is_displayed()
    lines = tip.text.splitlines()
    assert lines[0].startswith(f"session {EVIL} (play ")
    assert re.fullmatch(r"turn \d+: ISL \d+, OSL 12", lines[1])
    assert re.fullmatch(r"start -?[\d.]+ s, TTFT [\d.]+ ms, E2EL [\d.]+ s", lines[2])
