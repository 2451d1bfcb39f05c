"""HDR recorders for one measurement level, and the statistics reported from them.

Every latency is recorded in microseconds with 3 significant digits (HdrHistogram), so results
keep the exact distribution and runs (or worker processes) merge without loss. Definitions:

- TTFT: request sent (intended send time in open loop) -> first content chunk received.
- ITL: gap between consecutive content chunks; `tokens_per_chunk` records how many tokens each
  chunk carried (speculative decoding can put several in one chunk).
- TPOT: per request, (E2EL - TTFT) / (OSL - 1); only requests with OSL >= 2 whose tokens came
  in at least two chunks have one (a single chunk shows no decode interval at all).
- interactivity: per request 1 / TPOT in tokens/s/user. Its percentiles are the *slow tail*:
  "p90 interactivity" = 1 / p90(TPOT). The histogram keeps milli-tokens/s for mean and merging.
- E2EL: request sent -> last token received; normalized E2EL = E2EL / OSL (microseconds/token).
- queue_delay (open loop only): actual send time - intended send time.
- loop_lag: how late the client's event loop woke a periodic timer (the client's own health).
"""

from __future__ import annotations

import base64
import itertools
import math

import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen.results.metric_registry import METRIC_BY_NAME, METRICS

SIGNIFICANT_DIGITS = 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
INTERACTIVITY_NOTE = "percentiles are the slow tail: pX = 1 / pX(TPOT)"


def new_histogram(name: str) -> HdrHistogram:
    """An empty histogram of metric `name` (loadgen/results/metric_registry.py), up to its highest value."""
    return HdrHistogram(1, METRIC_BY_NAME[name].highest, SIGNIFICANT_DIGITS)


def record_many(hist: HdrHistogram, values: np.ndarray) -> None:
    """Record every value of an int64 array at once; the same counts as `record_value` per value.

    Per-token values (ITL, tokens per chunk) go through here in batches, so the client spends a
    fraction of a microsecond per token on them instead of a Python call each.
    """
    if values.size == 0:
        return
    low_value, high_value = int(values.min()), int(values.max())
    if low_value < 0 or high_value > hist.highest_trackable_value:
        values = np.clip(values, 0, hist.highest_trackable_value)
        low_value, high_value = max(0, low_value), min(high_value, hist.highest_trackable_value)
    _add_counts(hist, _bucket_indices(hist, values), low_value, high_value)


def record_batches(batches: list[tuple[HdrHistogram, list[int]]]) -> None:
    """`record_many` of several histograms of one bucket layout (the same lowest value and
    significant digits), each given a list of ints: the bucket arithmetic runs once over all the
    values. For LevelRecorder's per-request metrics, a few dozen values each, numpy's cost per
    call is most of the work. A list with values out of a histogram's range is clipped in place."""
    batches = [(hist, values) for hist, values in batches if values]
    if not batches:
        return
    layout = batches[0][0]
    for hist, _ in batches:
        if (hist.unit_magnitude, hist.sub_bucket_half_count_magnitude) != (
                layout.unit_magnitude, layout.sub_bucket_half_count_magnitude):
            raise ValueError("record_batches: the histograms differ in their bucket layout")
    bounds = []  # each batch's (histogram, lowest value, highest value), values clipped as record_many does
    for hist, values in batches:
        low_value, high_value = min(values), max(values)
        if low_value < 0 or high_value > hist.highest_trackable_value:
            values[:] = np.clip(values, 0, hist.highest_trackable_value).tolist()
            low_value, high_value = max(0, low_value), min(high_value, hist.highest_trackable_value)
        bounds.append((hist, low_value, high_value))
    total = sum(len(values) for _, values in batches)
    index = _bucket_indices(layout, np.fromiter(itertools.chain.from_iterable(values for _, values in batches),
                                                dtype=np.int64, count=total))
    start = 0
    for (hist, low_value, high_value), (_, values) in zip(bounds, batches):
        _add_counts(hist, index[start: start + len(values)], low_value, high_value)
        start += len(values)


def _bucket_indices(hist: HdrHistogram, values: np.ndarray) -> np.ndarray:
    """The counts index of each value (hdrh's `_counts_index_for`, vectorised); values in range."""
    # bit_length(v | mask) via the float exponent: exact, values stay far below 2**53
    bit_length = np.frexp((values | hist.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = bit_length - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub_bucket = values >> (bucket + hist.unit_magnitude)
    return ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + (sub_bucket - hist.sub_bucket_half_count)


def _add_counts(hist: HdrHistogram, index: np.ndarray, low_value: int, high_value: int) -> None:
    """Count values whose counts indices are `index` and whose range is [low_value, high_value]."""
    low, high = int(index.min()), int(index.max())
    counts = _counts_view(hist)[low: high + 1]  # only the buckets these values touch
    counts += np.bincount(index - low, minlength=high - low + 1).astype(counts.dtype)
    hist.total_count += int(index.size)
    hist.min_value = min(hist.min_value, low_value)
    hist.max_value = max(hist.max_value, high_value)


def _counts_view(hist: HdrHistogram) -> np.ndarray:
    """The histogram's ctypes counts as a numpy array (made once per histogram: it costs more
    than recording a small batch)."""
    view = getattr(hist, "_agentload_counts", None)
    if view is None:
        view = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
        hist._agentload_counts = view
    return view


def encode_histogram(hist: HdrHistogram) -> str:
    """HdrHistogram's standard compressed base64 form, as text for JSON."""
    return hist.encode().decode("ascii")


def decode_histogram(text: str) -> HdrHistogram:
    """Inverse of `encode_histogram`; raises ValueError on text that is not an HDR encoding."""
    try:
        base64.b64decode(text, validate=True)
        return HdrHistogram.decode(text.encode("ascii"))
    except Exception as exc:  # hdrh raises a mix of zlib/struct/ValueError
        raise ValueError(f"not an encoded HDR histogram: {exc}") from exc


def histogram_stats(hist: HdrHistogram) -> dict[str, float | int | None]:
    """count, mean, std, min, p50, p90, p95, p99, p99.9, max (None when empty).

    Same definitions as hdrh's own getters (a bucket counts at its median-equivalent value for
    mean and std, at its highest-equivalent value for percentiles), computed over the non-empty
    buckets only: hdrh's pure-Python iterators take seconds on a busy histogram.
    """
    count = hist.get_total_count()
    if count == 0:
        keys = ("mean", "std", "min", *(f"p{p:g}" for p in PERCENTILES), "max")
        return {"count": 0, **{key: None for key in keys}}
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    indices = np.flatnonzero(counts)
    weights = counts[indices].astype(np.float64)
    values = [hist.get_value_from_index(int(i)) for i in indices]
    medians = np.array([hist._hdr_median_equiv_value(v) for v in values], dtype=np.float64)
    mean = float(np.dot(weights, medians) / count)
    std = math.sqrt(float(np.dot(weights, (medians - mean) ** 2) / count))
    cumulative = np.cumsum(counts[indices])
    stats: dict[str, float | int | None] = {
        "count": count, "mean": round(mean, 3), "std": round(std, 3), "min": hist.get_min_value(),
    }
    for p in PERCENTILES:
        position = int(np.searchsorted(cumulative, hist.get_target_count_at_percentile(p)))
        stats[f"p{p:g}"] = hist.get_highest_equivalent_value(values[position])
    stats["max"] = hist.get_max_value()
    return stats


def interactivity_stats(tpot: HdrHistogram, interactivity: HdrHistogram) -> dict[str, float | int | None]:
    """Interactivity in tokens/s/user with slow-tail percentiles: pX = 1 / pX(TPOT).

    min/max are the slowest/fastest user (1 / max TPOT, 1 / min TPOT); mean and std are over
    requests, from the interactivity histogram (kept in milli-tokens/s).
    """
    stats = histogram_stats(tpot)
    if not stats["count"]:
        return stats

    own = histogram_stats(interactivity)
    mean, std = own["mean"], own["std"]
    assert mean is not None and std is not None  # the same requests as the non-empty TPOT histogram

    def per_s(tpot_us: float | int | None) -> float | None:
        return round(1e6 / tpot_us, 3) if tpot_us else None

    out: dict[str, float | int | None] = {
        "count": stats["count"],
        "mean": round(mean / 1000, 3),
        "std": round(std / 1000, 3),
        "min": per_s(stats["max"]),
    }
    for p in PERCENTILES:
        out[f"p{p:g}"] = per_s(stats[f"p{p:g}"])
    out["max"] = per_s(stats["min"])
    return out


class LevelRecorder:
    """All histograms of one level; fed one finished request at a time.

    Values wait in plain lists and are recorded in batches (`record_many`), a few hundred
    requests at a time: a fraction of a microsecond per value instead of a Python call each,
    and a batch is small enough (about a millisecond) never to stall the event loop, whose
    late reads would smear the arrival stamps of the chunks queued meanwhile.
    """

    FLUSH_EVERY = 64  # requests per batch: about a millisecond of recording
    LOOP_LAGS_KEPT = 1024  # loop-lag samples (one per loop_lag.INTERVAL_S) kept at most between two batches

    def __init__(self) -> None:
        self.hists = {metric.name: new_histogram(metric.name) for metric in METRICS}
        self._pending: dict[str, list[int]] = {name: [] for name in ("ttft", "e2el", "norm_e2el", "tpot",
                                                                      "interactivity", "queue_delay", "loop_lag")}
        self._chunk_times: list[list[int]] = []
        self._chunk_tokens: list[list[int]] = []  # of the requests whose chunks are not all of one token
        self._one_token_chunks = 0  # the chunks of the others, the usual stream: one token each

    def record_latencies(
        self,
        ttft_us: int,
        e2el_us: int,
        osl: int,
        chunk_ns: list[int],
        chunk_tokens: list[int],
    ) -> int | None:
        """Record one successful request (at least one chunk); returns its TPOT in microseconds
        (None when undefined)."""
        pending = self._pending
        pending["ttft"].append(ttft_us)
        pending["e2el"].append(e2el_us)
        if osl > 0:
            pending["norm_e2el"].append(e2el_us // osl)
        self._chunk_times.append(chunk_ns)
        if chunk_tokens.count(1) == len(chunk_tokens):
            self._one_token_chunks += len(chunk_tokens)  # counted, not converted value by value
        else:
            self._chunk_tokens.append(chunk_tokens)
        tpot_us = None
        if osl >= 2 and len(chunk_ns) >= 2:
            tpot_us = max(1, (e2el_us - ttft_us) // (osl - 1))
            pending["tpot"].append(tpot_us)
            pending["interactivity"].append(10**9 // tpot_us)
        if len(self._chunk_times) >= self.FLUSH_EVERY:
            self.flush()
        return tpot_us

    def flush(self) -> None:
        """Record the batched values: per-request latencies, ITLs (gaps within each request) and
        tokens per chunk, each metric in one vectorised pass."""
        pending = self._pending
        record_batches([(self.hists[name], values) for name, values in pending.items()])
        for values in pending.values():
            values.clear()
        if not self._chunk_times:
            return
        lengths = np.fromiter(map(len, self._chunk_times), dtype=np.int64, count=len(self._chunk_times))
        total = int(lengths.sum())
        times = np.fromiter(itertools.chain.from_iterable(self._chunk_times), dtype=np.int64, count=total)
        within = np.ones(max(0, total - 1), dtype=bool)
        within[np.cumsum(lengths)[:-1] - 1] = False  # a gap across two requests is no ITL
        record_many(self.hists["itl"], np.diff(times)[within] // 1000)
        tokens_per_chunk = self.hists["tokens_per_chunk"]
        if self._one_token_chunks:
            tokens_per_chunk.record_value(1, self._one_token_chunks)
        if self._chunk_tokens:
            record_many(tokens_per_chunk, np.fromiter(itertools.chain.from_iterable(self._chunk_tokens),
                                                      dtype=np.int64, count=total - self._one_token_chunks))
        self._chunk_times, self._chunk_tokens, self._one_token_chunks = [], [], 0

    def record_queue_delay(self, delay_us: int) -> None:
        self._pending["queue_delay"].append(delay_us)  # recorded with the next batch

    def record_loop_lag(self, lag_us: int) -> None:
        """Recorded with the next batch (a negative lag counts as 0: `record_many` clips)."""
        pending = self._pending["loop_lag"]
        pending.append(lag_us)
        if len(pending) >= self.LOOP_LAGS_KEPT:  # no request completes: the list stays bounded
            self.flush()

    def encoded(self) -> dict[str, str]:
        """Every histogram in HDR's encoded form, for merging in another process."""
        self.flush()
        return {name: encode_histogram(hist) for name, hist in self.hists.items()}

    def summary(self) -> dict[str, dict]:
        """{metric: {"unit", "description", "stats", "hdr"}} for the results file."""
        self.flush()
        out = {}
        for metric in METRICS:
            hist = self.hists[metric.name]
            if metric.name == "interactivity":
                stats = interactivity_stats(self.hists["tpot"], hist)
            else:
                stats = histogram_stats(hist)
            entry = {"unit": metric.unit, "description": metric.description, "stats": stats,
                     "hdr": encode_histogram(hist)}
            if metric.hdr_unit:  # the statistics are not in the histogram's unit (interactivity)
                entry["hdr_unit"] = metric.hdr_unit
                entry["note"] = INTERACTIVITY_NOTE
            out[metric.name] = entry
        return out

