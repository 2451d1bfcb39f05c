"""The HTML report's timeline of a level: the session plays as swim lanes and the server's series beneath them.

Each lane is one play's parent agent, or one of its subagents on a sub-lane below it; each request a bar from
its start (`start_ms`, from the window's start) to its first token (waiting) and on to its last (streaming),
so the gaps between bars are think time. Beneath, on the same x axis: the requests running and waiting at the
server and its KV-cache usage (`server_metrics.series`), and GPU power (`gpu.series` per GPU, else the server's
`gpu_power_watts`), with the window's bounds marked and the warm-up before it and the drain after it shaded.

The browser draws them with uPlot (1.6.32, MIT: `npm pack uplot`'s dist/uPlot.iife.min.js and uPlot.min.css,
vendored in loadgen/report/static/uplot/ with its licence) and
loadgen/report/static/timeline.js, both inlined into the report: it loads nothing. A level's data travel as JSON in a
`<script type="application/json">` block with `<`, `>` and `&` escaped, so no text from a results file (a session
id holding `</script>`) can end the block. A level can hold tens of thousands of requests: the lanes shown are
the first plays by start, at most MAX_LANES lanes and MAX_BARS requests, and the page says how many that is;
a series of more than MAX_POINTS readings (an hour of scrapes every second is 3,600) is thinned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

STATIC = Path(__file__).with_name("static")
MAX_LANES = 48
MAX_BARS = 4000
MAX_POINTS = 2000  # readings per series drawn: a longer one is thinned to every k-th reading
LABEL_CHARS = 28  # a lane's label is cut to this many characters (the tooltip has the whole id)
# (title, unit, ((series name, line label, scale), ...)) of the charts drawn from `server_metrics.series`
SERVER_CHARTS = (
    ("requests at the server", "requests", (("running", "running", 1.0), ("waiting", "waiting", 1.0))),
    ("KV-cache usage", "%", (("kv_cache_usage", "KV cache used", 100.0),)),
)
POWER_TITLE = "GPU power"

STYLE = """
.timeline { margin: 0.5em 0 1.5em; max-width: 1400px; }
.timeline .uplot { margin-bottom: 0.3em; }
.timeline .uplot table, .timeline .uplot th, .timeline .uplot td { border: none; background: none; margin: 0; }
.timeline .u-title { font-size: 0.95em; font-weight: 600; text-align: left; padding-left: 1em; }
.tl-key span { display: inline-block; width: 0.9em; height: 0.9em; margin: 0 0.3em 0 1em; vertical-align: middle; }
.tl-key .tl-wait { background: #e8a33d; } .tl-key .tl-stream { background: #3b6fb6; }
.tl-key .tl-out { background: rgba(0, 0, 0, 0.12); } .tl-key .tl-mark { background: #c03030; width: 2px; }
.tl-tip { position: absolute; display: none; pointer-events: none; white-space: pre; z-index: 10;
          background: #fffff4; border: 1px solid #999; padding: 0.3em 0.5em; font-size: 0.85em; }
"""


def has_timeline(level: dict[str, Any]) -> bool:
    """Whether the level's requests carry start times (results of earlier versions do not)."""
    return bool(_rows(level["requests"]))


def head_style() -> str:
    """The CSS of the timelines: uPlot's and ours."""
    return (STATIC / "uplot" / "uPlot.min.css").read_text(encoding="utf-8") + STYLE


def scripts() -> str:
    """uPlot and the timeline code, inlined; they draw every level's timeline when the page loads."""
    code = [(STATIC / "uplot" / "uPlot.iife.min.js").read_text(encoding="utf-8"),
            (STATIC / "timeline.js").read_text(encoding="utf-8")]
    # `</script` inside code would end the element early; `<\/script` means the same to JavaScript
    return "".join("<script>" + text.replace("</script", "<\\/script") + "</script>" for text in code)


def level_timeline(level: dict[str, Any], key: str) -> str:
    """The level's timeline: its heading, what is shown, the element the charts are drawn into and their data."""
    rows = _rows(level["requests"])
    if not rows:
        why = ("no request was measured" if "start_ms" in level["requests"]
               else "the requests have no start times (results of an earlier version)")
        return f"<h4>Timeline</h4><p>No timeline: {why}.</p>"
    data, shown = timeline_data(level, rows)
    window_s = level["window_s"]
    notes = [f"Lanes: {shown['plays']} of {shown['plays_total']} session plays ({shown['requests']} of "
             f"{shown['requests_total']} requests), the first by start; subagents on the lanes marked &#8627; "
             f"under their play. The window runs from 0 to {window_s:.1f} s.",
             "Drag across a chart to zoom (all of the level's charts follow), double-click to zoom out; hover "
             "over a bar for its request."]
    if missing := _no_series(level):
        notes.append(escape(missing))
    key_html = ('<p class="tl-key"><span class="tl-wait"></span>waiting for the first token'
                '<span class="tl-stream"></span>streaming<span class="tl-out"></span>warm-up and drain, '
                'outside the window<span class="tl-mark"></span>the window\'s start and end; gaps are think time</p>')
    return (f"<h4>Timeline</h4>{''.join(f'<p>{note}</p>' for note in notes)}{key_html}"
            f'<div class="timeline" id="{escape(key)}"></div>'
            f'<script type="application/json" class="tl-data" data-target="{escape(key)}">{embed_json(data)}</script>')


def embed_json(doc: Any) -> str:
    """JSON that is safe inside a <script> element: `<`, `>` and `&` as \\u escapes, which JSON.parse reads back."""
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def timeline_data(level: dict[str, Any], rows: Sequence[int]) -> tuple[dict[str, Any], dict[str, int]]:
    """What timeline.js draws (the lanes, one bar per request shown with times in ms, the charts, the x range),
    and how many plays and requests of how many that shows."""
    columns = level["requests"]
    lanes, bars, shown = _lanes(columns, rows)
    charts = _charts(level)
    starts = [columns["start_ms"][i] / 1e3 for i in bars["row"]]
    ends = [columns["start_ms"][i] / 1e3 + columns["e2el_us"][i] / 1e6 for i in bars["row"]]
    times = [t for chart in charts for t in chart["t_s"]]
    x = [min(0.0, *starts, *times), max(level["window_s"], *ends, *times)]
    data = {"window_s": level["window_s"], "x": x, "lanes": lanes, "bars": _bar_columns(columns, bars["row"], bars),
            "charts": charts}
    return data, shown


def _rows(columns: dict[str, list]) -> list[int]:
    """The requests that can be drawn: those with a start time, a TTFT and an E2EL."""
    starts = columns.get("start_ms")
    if starts is None:
        return []
    return [i for i, (start, ttft, e2el) in enumerate(zip(starts, columns["ttft_us"], columns["e2el_us"]))
            if start is not None and ttft is not None and e2el is not None]


def _lanes(columns: dict[str, list], rows: Sequence[int]) -> tuple[list[dict], dict[str, list], dict[str, int]]:
    """The lanes of the first plays by start within the caps (the first play always), and their bars."""
    agents = columns.get("agent") or [""] * len(columns["play"])
    plays: dict[Any, list[int]] = {}
    for i in sorted(rows, key=lambda i: columns["start_ms"][i]):
        plays.setdefault(columns["play"][i], []).append(i)
    lanes: list[dict] = []
    bars: dict[str, list] = {"row": [], "lane": []}
    for play, members in plays.items():
        by_agent: dict[str, list[int]] = {"": []}  # the parent's lane first, then the subagents' by start
        for i in members:
            by_agent.setdefault(agents[i], []).append(i)
        chosen = [(agent, rows_of) for agent, rows_of in by_agent.items() if rows_of]
        if lanes and (len(lanes) + len(chosen) > MAX_LANES or len(bars["row"]) + len(members) > MAX_BARS):
            break
        session = str(columns["session"][members[0]])
        for agent, rows_of in chosen:
            label = f"\u21b3 {agent}" if agent else session  # the play's id is in the tooltip
            lanes.append({"label": _cut(label), "play": play, "session": session, "agent": agent})
            bars["row"] += rows_of
            bars["lane"] += [len(lanes) - 1] * len(rows_of)
    bars = {name: values[:MAX_BARS] for name, values in bars.items()}
    shown = {"plays": len({lane["play"] for lane in lanes}), "plays_total": len(plays),
             "requests": len(bars["row"]), "requests_total": len(rows)}
    return lanes, bars, shown


def _cut(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "\u2026"


def _bar_columns(columns: dict[str, list], rows: Sequence[int], bars: dict[str, list]) -> dict[str, list]:
    """The bars as columns: lane, start (ms from the window's start), TTFT and E2EL (ms), turn, ISL, OSL."""
    return {"lane": bars["lane"],
            "start": [round(columns["start_ms"][i], 1) for i in rows],
            "ttft": [round(columns["ttft_us"][i] / 1e3, 1) for i in rows],
            "e2el": [round(columns["e2el_us"][i] / 1e3, 1) for i in rows],
            **{name: [columns[name][i] for i in rows] for name in ("turn", "isl", "osl")}}


def _charts(level: dict[str, Any]) -> list[dict[str, Any]]:
    """The series charts that have data: the server's gauges, then GPU power."""
    series = (level.get("server_metrics") or {}).get("series") or {}
    charts = [_chart(title, unit, series["t_s"], [(label, series.get(name), scale) for name, label, scale in lines])
              for title, unit, lines in SERVER_CHARTS if series.get("t_s")]
    gpu = (level.get("gpu") or {}).get("series") or {}
    power = gpu.get("power_w")
    if gpu.get("t_s") and isinstance(power, dict):
        charts.append(_chart(POWER_TITLE, "W", gpu["t_s"],
                             [(f"GPU {index}", values, 1.0) for index, values in power.items()]))
    elif series.get("t_s"):
        charts.append(_chart(POWER_TITLE, "W", series["t_s"],
                             [("all GPUs (server)", series.get("gpu_power_watts"), 1.0)]))
    return [chart for chart in charts if chart["lines"]]


def _chart(title: str, unit: str, t_s: Sequence[float],
           lines: Sequence[tuple[str, Sequence[float | None] | None, float]]) -> dict[str, Any]:
    """A chart of the lines that have a reading; readings scaled, non-finite ones as gaps, at most MAX_POINTS."""
    step = math.ceil(len(t_s) / MAX_POINTS)
    drawn = [{"label": label, "values": [_scaled(v, scale) for v in values[::step]]}
             for label, values, scale in lines if values and any(v is not None for v in values)]
    return {"title": title, "unit": unit, "t_s": list(t_s[::step]), "lines": drawn}


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value * scale, 4)


def _no_series(level: dict[str, Any]) -> str | None:
    """Why the level has no server series to draw, or None when it has them."""
    metrics = level.get("server_metrics")
    if metrics is None:
        return "No server series: /metrics was not scraped (or the results predate it)."
    if not metrics.get("scrapes"):
        errors = metrics.get("errors") or []
        return "No server series: no scrape of /metrics succeeded" + (f" ({errors[0]})." if errors else ".")
    return None
