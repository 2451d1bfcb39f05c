"""Every metric loadgen records or reports, defined once: its name, label, unit, scale and which
direction is better. The recorder and the results file (metrics.py, file.py), the level table
(loadgen/report/table.py), the plots, the sweep summary, the Pareto axes and `loadgen compare`
read them from here.

`METRICS` are the per-request distributions a level records in HDR histograms (its `metrics` in
the results file). `STATISTICS` are the numbers a level is judged by: percentiles of those
metrics and throughputs. `loadgen compare` computes them from a level's per-request columns
(`column`, `q`, `inverse`, `per_gpu`); the reports read them from its stored statistics
(`stored_value`), so both show one value in one unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HIGHEST_US = 4 * 3600 * 10**6  # four hours: longer than any timeout we allow


@dataclass(frozen=True, slots=True)
class Metric:
    """A per-request distribution: `level["metrics"][name]` in the results file."""

    name: str
    label: str
    unit: str  # of its statistics in the results file
    highest: int  # the largest value its histogram tracks, in `hdr_unit`
    description: str
    higher_is_better: bool | None  # None: neither (how the server streams, not how well)
    shown_unit: str  # the level table's unit
    scale: float = 1.0  # unit -> shown_unit
    hdr_unit: str = ""  # the histogram's own unit, where it is not `unit`
    # the per-request column it is judged by (an SLO's bounds, `loadgen compare`): the results file's
    # `requests` columns, with norm_e2el_us = e2el_us / osl; interactivity reads TPOT (1e6 / tpot_us)
    column: str | None = None


METRICS: tuple[Metric, ...] = (
    Metric("ttft", "TTFT", "us", HIGHEST_US, "request sent -> first content chunk", False, "ms", 1e-3,
           column="ttft_us"),
    Metric("itl", "ITL", "us", HIGHEST_US, "gap between consecutive content chunks", False, "ms", 1e-3),
    Metric("tokens_per_chunk", "tokens per chunk", "tokens", 10**7, "tokens carried by one content chunk", None,
           "tok"),
    Metric("tpot", "TPOT", "us", HIGHEST_US, "(E2EL - TTFT) / (OSL - 1) per request", False, "ms", 1e-3,
           column="tpot_us"),
    Metric("interactivity", "interactivity (slow tail)", "tok/s", 10**12,
           "1 / TPOT per request, tokens/s/user (histogram in milli-tokens/s)", True, "tok/s", hdr_unit="mtok/s",
           column="tpot_us"),
    Metric("e2el", "E2EL", "us", HIGHEST_US, "request sent -> last token", False, "ms", 1e-3, column="e2el_us"),
    Metric("norm_e2el", "E2EL / OSL", "us/token", HIGHEST_US, "E2EL / OSL per request", False, "ms/tok", 1e-3,
           column="norm_e2el_us"),
    Metric("queue_delay", "client queue delay", "us", HIGHEST_US, "open loop: actual send - intended send", False,
           "ms", 1e-3),
    Metric("loop_lag", "client loop lag", "us", HIGHEST_US, "client event-loop timer lateness", False, "ms", 1e-3),
)
METRIC_BY_NAME = {metric.name: metric for metric in METRICS}


@dataclass(frozen=True, slots=True)
class Statistic:
    """A number a level is judged by: a percentile of a per-request column, or a rate over the window."""

    name: str  # `loadgen compare --metric` and the gates name it so
    label: str
    unit: str
    higher_is_better: bool
    metric: str | None = None  # a percentile: of this recorded metric (its column, its stored statistics)
    q: float | None = None
    inverse: bool = False  # shown value = scale / percentile (interactivity)
    scale: float = 1.0  # column unit -> shown unit
    counted: str | None = None  # a rate: the per-request column counted over the window
    throughput: str | None = None  # ... and the level's `throughput` figure it is
    per_gpu: bool = False
    short: str = ""  # the header of a narrow column (the sweep summary); the label when empty

    @property
    def column(self) -> str:
        """The per-request column it is computed from (loadgen/compare/stats.py)."""
        column = self.counted if self.metric is None else METRIC_BY_NAME[self.metric].column
        assert column is not None, f"{self.name}: a statistic reads a per-request column"
        return column

    @property
    def header(self) -> str:
        return self.short or self.label


STATISTICS: tuple[Statistic, ...] = (
    Statistic("ttft_p50", "TTFT p50", "ms", False, "ttft", 50, scale=1e-3),
    Statistic("ttft_p90", "TTFT p90", "ms", False, "ttft", 90, scale=1e-3),
    Statistic("ttft_p99", "TTFT p99", "ms", False, "ttft", 99, scale=1e-3),
    Statistic("tpot_p50", "TPOT p50", "ms", False, "tpot", 50, scale=1e-3),
    Statistic("tpot_p90", "TPOT p90", "ms", False, "tpot", 90, scale=1e-3),
    Statistic("interactivity_p50", "interactivity p50", "tok/s", True, "interactivity", 50, inverse=True, scale=1e6,
              short="intvty p50"),
    Statistic("interactivity_p90", "interactivity p90 (slow tail)", "tok/s", True, "interactivity", 90, inverse=True,
              scale=1e6, short="slow-tail intvty p90"),
    Statistic("e2el_p50", "E2EL p50", "s", False, "e2el", 50, scale=1e-6),
    Statistic("e2el_p90", "E2EL p90", "s", False, "e2el", 90, scale=1e-6),
    Statistic("e2el_p99", "E2EL p99", "s", False, "e2el", 99, scale=1e-6),
    Statistic("norm_e2el_p90", "E2EL/OSL p90", "ms/tok", False, "norm_e2el", 90, scale=1e-3),
    Statistic("e2e_interactivity", "e2e interactivity", "tok/s", True, "norm_e2el", 90, inverse=True, scale=1e6,
              short="e2e intvty"),
    Statistic("output_tput_per_gpu", "output tok/s per GPU", "tok/s", True, counted="osl",
              throughput="output_tokens_per_s_per_gpu", per_gpu=True, short="out tok/s/GPU"),
    Statistic("total_tput_per_gpu", "total tok/s per GPU", "tok/s", True, counted="tokens",
              throughput="total_tokens_per_s_per_gpu", per_gpu=True, short="total tok/s/GPU"),
    Statistic("request_rate", "requests/s", "req/s", True, counted="ones", throughput="requests_per_s"),
)
STATISTIC_BY_NAME = {statistic.name: statistic for statistic in STATISTICS}


def stored_value(level: dict[str, Any], statistic: Statistic) -> float | None:
    """The statistic of a results-file level, in its shown unit, from the level's stored HDR
    statistics or throughput (None where the level has none). Interactivity's stored percentiles
    are already its slow tail in tok/s (loadgen/results/metrics.py); the others scale (or invert)
    as they do from the requests' column."""
    if statistic.throughput is not None:
        return level["throughput"][statistic.throughput]
    assert statistic.metric is not None and statistic.q is not None, "a percentile names its metric"
    value = level["metrics"][statistic.metric]["stats"][f"p{statistic.q:g}"]
    if value is None or METRIC_BY_NAME[statistic.metric].unit == statistic.unit:
        return value
    if statistic.inverse:
        return statistic.scale / value if value else None
    return value * statistic.scale
