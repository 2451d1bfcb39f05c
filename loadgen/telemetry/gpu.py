"""GPU telemetry for a replay: power, energy, SM clock, memory used and utilisation per GPU, sampled on a
background thread from NVML (nvidia-ml-py), amdsmi (ROCm) or Prometheus text (our server's agentload:gpu_*
metrics, or a DCGM exporter), and each level's energy per output token and per request from those samples.

`choose_source` picks the source a `--gpu-telemetry` flag names (the sources: loadgen/telemetry/gpu_sources.py
and gpu_prometheus.py). Reads block (library calls, an HTTP GET), so sources are read on the sampler's thread,
never on the event loop. A window's energy comes from each GPU's cumulative energy counter where the source has
one, else from the trapezoid of its power readings. Where telemetry is missing, every derived number is None and
the window says why: nothing missing is reported as 0.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.errors import UsageError
from loadgen.telemetry.gpu_prometheus import PrometheusGpuSource
from loadgen.telemetry.gpu_sources import (
    AmdSmiSource,
    GpuReading,
    GpuSource,
    GpuTelemetryError,
    NoGpuSource,
    NvmlSource,
)

SOURCE_CHOICES = "auto, nvml, amdsmi, server, off or the http(s) URL of Prometheus metrics (a DCGM exporter)"


def _metrics_url(url: str) -> str:
    """An exporter's URL, with /metrics as its path when it has none."""
    stripped = url.rstrip("/")
    return stripped if urllib.parse.urlsplit(stripped).path else stripped + "/metrics"


def _server_metrics_url(base_url: str) -> str:
    """The /metrics of the server at `base_url`, the URL its /v1 routes hang from."""
    return base_url.rstrip("/") + "/metrics"


def choose_source(choice: str | None, server_url: str | None) -> GpuSource:
    """The source `--gpu-telemetry` names: auto (the default), nvml, amdsmi, server, off, or an http(s) URL.
    auto takes NVML if it loads and sees a GPU, else amdsmi, else the server's /metrics if it exports GPU
    metrics, else a NoGpuSource whose describe() says why each was passed over. A named source that cannot be
    opened raises UsageError. Blocking (it loads libraries and may scrape), so call it off the event loop."""
    choice = choice or "auto"
    if choice == "off":
        return NoGpuSource("no GPU telemetry: --gpu-telemetry off")
    if choice == "auto":
        return _first_available(server_url)
    try:
        return _opener(choice, server_url)()
    except GpuTelemetryError as exc:
        raise UsageError(f"--gpu-telemetry {choice}: {exc}") from None


def _opener(choice: str, server_url: str | None) -> Callable[[], GpuSource]:
    if choice == "nvml":
        return NvmlSource
    if choice == "amdsmi":
        return AmdSmiSource
    if choice == "server":
        if server_url is None:
            raise UsageError("--gpu-telemetry server: there is no server to scrape (the engine runs in this "
                             "process); use nvml or amdsmi")
        return lambda: PrometheusGpuSource(_server_metrics_url(server_url))
    if choice.startswith(("http://", "https://")):
        return lambda: PrometheusGpuSource(_metrics_url(choice))
    raise UsageError(f"--gpu-telemetry: expected {SOURCE_CHOICES}, got {choice!r}")


def _first_available(server_url: str | None) -> GpuSource:
    openers: list[Callable[[], GpuSource]] = [NvmlSource, AmdSmiSource]
    if server_url is not None:
        openers.append(lambda: PrometheusGpuSource(_server_metrics_url(server_url)))
    reasons = []
    for open_source in openers:
        try:
            return open_source()
        except GpuTelemetryError as exc:
            reasons.append(str(exc))
    if server_url is None:
        reasons.append("no server /metrics to scrape (the engine runs in this process)")
    return NoGpuSource("no GPU telemetry: " + "; ".join(reasons))


@dataclass(frozen=True, slots=True)
class GpuSample:
    t_ns: int  # time.perf_counter_ns, the clock of a level's window: the middle of the read
    readings: tuple[GpuReading, ...]


@dataclass(frozen=True, slots=True)
class GpuStats:
    """One GPU over a window; None where its readings lack the field."""

    index: int
    name: str
    energy_j: float | None
    avg_watts: float | None
    energy_from: str | None  # "counter" or "power" (the trapezoid of the power readings)
    mean_sm_clock_mhz: float | None
    max_memory_used_bytes: int | None
    mean_utilization: float | None


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """A level's measurement window: energy per GPU and per unit of work. Every value that could not be
    measured is None, and `missing` says why (empty when nothing is missing)."""

    source: str
    duration_s: float
    gpus: tuple[GpuStats, ...]
    energy_j: float | None
    avg_watts_per_gpu: float | None
    joules_per_output_token: float | None
    joules_per_request: float | None
    output_tokens_per_s_per_kw: float | None
    failed_reads: int
    missing: tuple[str, ...]


class GpuSampler:
    """Reads a source every `interval_s` on a daemon thread (its reads block) and keeps every sample, from
    which `window` computes a level's energy per output token and per request."""

    def __init__(self, source: GpuSource, interval_s: float = 1.0,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        if interval_s <= 0:
            raise ValueError(f"GPU sampling interval: must be positive, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self._clock = clock
        self._samples: list[GpuSample] = []
        self._failures: list[tuple[int, str]] = []  # (time, error)
        self._lock = threading.Lock()  # one read at a time, so samples stay in time order
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def samples(self) -> tuple[GpuSample, ...]:
        with self._lock:
            return tuple(self._samples)

    def start(self) -> None:
        if not isinstance(self.source, NoGpuSource):
            self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops the thread after one last sample (a window that just ended is then covered) and closes the
        source."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None
            self.sample()
        self.source.close()

    def sample(self) -> None:
        """One read now, on the calling thread; a failed read is counted, not raised."""
        with self._lock:
            before = self._clock()
            try:
                readings = self.source.read()
            except GpuTelemetryError as exc:
                self._failures.append((before, str(exc)))
                return
            self._samples.append(GpuSample((before + self._clock()) // 2, tuple(readings)))

    def _run(self) -> None:
        self.sample()
        while not self._stopping.wait(self.interval_s):
            self.sample()

    def window(self, start_ns: int, end_ns: int, output_tokens: int, requests: int) -> GpuWindow:
        """Energy over [start_ns, end_ns] (perf_counter_ns), interpolated between the samples around each end:
        a sample must exist at or before the start and at or after the end (take one with `sample()`, off the
        event loop, or wait one interval)."""
        if end_ns <= start_ns:
            raise ValueError(f"GPU window: the end ({end_ns}) must come after the start ({start_ns})")
        with self._lock:
            samples = list(self._samples)
            failures = [error for t, error in self._failures if start_ns <= t <= end_ns]
        duration_s = (end_ns - start_ns) / 1e9
        gpus, missing = _window_gpus(samples, start_ns, end_ns, self.source, failures)
        energies = [gpu.energy_j for gpu in gpus]
        energy = sum(e for e in energies if e is not None) if gpus and None not in energies else None
        per_token, why_token = _ratio(energy, output_tokens, "joules per output token: no output tokens")
        per_request, why_request = _ratio(energy, requests, "joules per request: no requests")
        tokens_per_kj, why_kj = _ratio(None if energy is None else output_tokens * 1e3, energy,
                                       "output tok/s per kW: the GPUs' energy did not grow")
        return GpuWindow(
            source=self.source.describe(), duration_s=duration_s, gpus=gpus, energy_j=energy,
            avg_watts_per_gpu=None if energy is None else energy / duration_s / len(gpus),
            joules_per_output_token=per_token, joules_per_request=per_request,
            output_tokens_per_s_per_kw=tokens_per_kj,  # tok/s per kW is tokens per kJ
            failed_reads=len(failures),
            missing=(*missing, *(why for why in (why_token, why_request, why_kj) if why is not None)))


def _ratio(numerator: float | None, denominator: float | None, zero: str) -> tuple[float | None, str | None]:
    """numerator / denominator, None when the numerator is missing (its reason is given already) and with
    `zero` in the window as the reason when the denominator is not positive."""
    if numerator is None or denominator is None:
        return None, None
    if denominator <= 0:
        return None, zero + " in the window"
    return numerator / denominator, None


def _window_gpus(samples: list[GpuSample], start_ns: int, end_ns: int, source: GpuSource,
                 failures: list[str]) -> tuple[tuple[GpuStats, ...], list[str]]:
    """Each GPU's stats over the window, and why values are missing."""
    failed = f" (failed reads in the window: {len(failures)}, the last: {failures[-1]})" if failures else ""
    if isinstance(source, NoGpuSource):
        return (), [source.describe()]
    times = [sample.t_ns for sample in samples]
    first, last = bisect.bisect_right(times, start_ns) - 1, bisect.bisect_left(times, end_ns)
    if first < 0 or last == len(samples):
        edge = "at or before its start" if first < 0 else "at or after its end"
        return (), [f"no GPU energy: no sample {edge} covers the window{failed}"]
    span = samples[first:last + 1]
    indices = sorted({reading.index for sample in span for reading in sample.readings})
    stats = [_gpu_stats(index, span, start_ns, end_ns) for index in indices]
    missing = [reason for _, reason in stats if reason is not None]
    if not indices:
        missing.append(f"no GPU energy: the samples around the window hold no GPU{failed}")
    return tuple(gpu for gpu, _ in stats), missing


def _gpu_stats(index: int, span: list[GpuSample], start_ns: int, end_ns: int) -> tuple[GpuStats, str | None]:
    points = [(s.t_ns, r) for s in span for r in s.readings if r.index == index]
    inside = [r for t, r in points if start_ns <= t <= end_ns]
    energy, energy_from, reason = _energy(index, points, span, start_ns, end_ns)
    clocks = [r.sm_clock_mhz for r in inside if r.sm_clock_mhz is not None]
    memory = [r.memory_used_bytes for r in inside if r.memory_used_bytes is not None]
    utilization = [r.utilization for r in inside if r.utilization is not None]
    stats = GpuStats(
        index=index, name=points[0][1].name, energy_j=energy,
        avg_watts=None if energy is None else energy / ((end_ns - start_ns) / 1e9), energy_from=energy_from,
        mean_sm_clock_mhz=float(np.mean(clocks)) if clocks else None, max_memory_used_bytes=max(memory, default=None),
        mean_utilization=float(np.mean(utilization)) if utilization else None)
    return stats, reason


def _energy(index: int, points: list[tuple[int, GpuReading]], span: list[GpuSample], start_ns: int,
            end_ns: int) -> tuple[float | None, str | None, str | None]:
    """(joules over the window, "counter" or "power", None) or (None, None, why not)."""
    if points[0][0] != span[0].t_ns or points[-1][0] != span[-1].t_ns:
        return None, None, f"GPU {index}: missing from the samples around the window's start or end"
    t_s = np.array([t - start_ns for t, _ in points], dtype=np.float64) / 1e9  # from the start
    counter = [r.energy_j for _, r in points]
    power = [r.power_w for _, r in points]
    if None not in counter:
        cumulative, energy_from = np.array(counter, dtype=np.float64), "counter"
        if np.any(np.diff(cumulative) < 0):
            return None, None, f"GPU {index}: its energy counter went backwards (reset) in the window"
    elif None not in power:
        watts = np.array(power, dtype=np.float64)
        # The trapezoid up to each sample; between samples it is interpolated linearly.
        cumulative = np.concatenate(([0.0], np.cumsum((watts[1:] + watts[:-1]) / 2 * np.diff(t_s))))
        energy_from = "power"
    else:
        return None, None, f"GPU {index}: neither an energy counter nor power in every sample around the window"
    at_start, at_end = np.interp([0.0, (end_ns - start_ns) / 1e9], t_s, cumulative)
    return float(at_end - at_start), energy_from, None


def gpu_block(sampler: GpuSampler, level_started_ns: int, window_start_ns: int | None,
              level: dict[str, Any]) -> dict[str, Any]:
    """A level's `gpu` entry (docs/results_schema.md): the window's energy and its ratios, and each
    GPU's power as a series over the level (seconds from the window's start)."""
    counts = level["counts"]
    start = window_start_ns if window_start_ns is not None else level_started_ns
    out: dict[str, Any]
    if level["window_s"] > 0:
        out = dataclasses.asdict(sampler.window(start, start + int(level["window_s"] * 1e9), counts["output_tokens"],
                                                counts["requests_ok"]))
    else:
        out = {"source": sampler.source.describe(), "missing": ["no measurement window"]}
    samples = [s for s in sampler.samples if s.t_ns >= level_started_ns]
    power: dict[str, list[float | None]] = {}
    for number, sample in enumerate(samples):
        for reading in sample.readings:
            power.setdefault(str(reading.index), [None] * len(samples))[number] = reading.power_w
    out["series"] = {"t_s": [round((s.t_ns - start) / 1e9, 3) for s in samples], "power_w": power}
    return out
