"""GPU telemetry for a replay: power, energy, SM clock, memory used and utilisation per GPU, sampled on a
background thread from NVML (nvidia-ml-py), amdsmi (ROCm) or Prometheus text (our server's agentload:gpu_*
metrics, or a DCGM exporter), and each level's energy per output token and per request from those samples.

`choose_source` picks the source a `--gpu-telemetry` flag names. Reads block (library calls, an HTTP GET), so
sources are read on the sampler's thread, never on the event loop. A window's energy comes from each GPU's
cumulative energy counter where the source has one, else from the trapezoid of its power readings. Where telemetry
is missing, every derived number is None and the window says why: nothing missing is reported as 0.

The amdsmi path follows amdsmi's documented Python API and is tested against a fake module only, never on AMD
hardware.
"""

from __future__ import annotations

import bisect
import dataclasses
import http.client
import importlib
import itertools
import os
import re
import threading
import time
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from loadgen.errors import UsageError

SPEC_CHOICES = "auto, nvml, amdsmi, server, off or the http(s) URL of Prometheus metrics (a DCGM exporter)"


class GpuTelemetryError(Exception):
    """A source that cannot be opened or read; the message names the source and the cause."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one sample; a field the source does not report is None."""

    index: int  # as nvidia-smi, DCGM or amdsmi number the GPU
    name: str
    power_w: float | None
    energy_j: float | None  # a cumulative counter (its zero is the source's); None where there is none
    sm_clock_mhz: float | None
    memory_used_bytes: int | None
    utilization: float | None  # 0..1


class GpuSource(Protocol):
    def read(self) -> list[GpuReading]:
        """Every GPU's reading now (blocking); raises GpuTelemetryError."""

    def describe(self) -> str:
        """What is read, from where, and how energy is measured; or why nothing is."""

    def close(self) -> None: ...


class NoGpuSource:
    """No telemetry, and why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> list[GpuReading]:
        return []

    def describe(self) -> str:
        return self.reason

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Device:
    handle: Any
    index: int
    name: str
    has_energy_counter: bool


class _LibrarySource(ABC):
    """A vendor library's GPUs: imported and initialised when built, read per sample, shut down on close."""

    label = ""
    # The library's module, how to get it, and the names of its error class and of its init and shutdown calls.
    _module, _install, _error_class, _init_call, _shutdown_call = "", "", "", "", ""

    def __init__(self) -> None:
        self._lib = _import(self._module, f"{self.label}: cannot import {self._module} ({self._install})")
        self._error: type[Exception] = getattr(self._lib, self._error_class)
        with self._translated():
            getattr(self._lib, self._init_call)()
        try:
            with self._translated():
                self._devices = self._find()
            if not self._devices:
                raise GpuTelemetryError(f"{self.label}: no GPU{self._scope()}")
        except GpuTelemetryError:
            self._shutdown()
            raise
        self._open = True

    def read(self) -> list[GpuReading]:
        with self._translated():
            return [self._read(device) for device in self._devices]

    def describe(self) -> str:
        return f"{self.label}: {_gpus_text([(d.index, d.name, d.has_energy_counter) for d in self._devices])}"

    def close(self) -> None:
        if self._open:
            self._open = False
            self._shutdown()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except self._error as exc:
            raise GpuTelemetryError(f"{self.label}: {exc}") from exc

    def _has_counter(self, read_counter: Callable[[], object]) -> bool:
        try:
            read_counter()
        except self._error:  # no counter on this GPU (NVML: before Volta): the sampler integrates power
            return False
        return True

    def _scope(self) -> str:
        """Which GPUs were looked for, when not all of them."""
        return ""

    def _shutdown(self) -> None:
        getattr(self._lib, self._shutdown_call)()

    @abstractmethod
    def _find(self) -> list[_Device]: ...

    @abstractmethod
    def _read(self, device: _Device) -> GpuReading: ...


class NvmlSource(_LibrarySource):
    """NVIDIA GPUs through NVML: those CUDA_VISIBLE_DEVICES names when it is set, else all of the host's."""

    label = "NVML (nvidia-ml-py)"
    _module, _install = "pynvml", "pip install 'agentload[gpu]'"
    _error_class, _init_call, _shutdown_call = "NVMLError", "nvmlInit", "nvmlShutdown"

    def _scope(self) -> str:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})"

    def _find(self) -> list[_Device]:
        nvml = self._lib
        return [_Device(h, nvml.nvmlDeviceGetIndex(h), nvml.nvmlDeviceGetName(h),
                        self._has_counter(partial(nvml.nvmlDeviceGetTotalEnergyConsumption, h)))
                for h in _cuda_visible_handles(nvml)]

    def _read(self, device: _Device) -> GpuReading:
        nvml, h = self._lib, device.handle
        energy_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(h) if device.has_energy_counter else None
        return GpuReading(
            index=device.index, name=device.name, power_w=nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            energy_j=None if energy_mj is None else energy_mj / 1e3,
            sm_clock_mhz=float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            memory_used_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).used),
            utilization=nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100)


def _cuda_visible_handles(nvml: Any) -> list[Any]:
    """NVML handles of the GPUs CUDA numbers 0, 1, ...: CUDA_VISIBLE_DEVICES's indices or UUIDs up to the first
    entry CUDA would reject, or every GPU. NVML numbers GPUs in PCI order, CUDA fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID; on a node of one GPU model the two agree."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [str(i) for i in range(nvml.nvmlDeviceGetCount())] if visible is None else visible.split(",")
    ids = itertools.takewhile(lambda e: e.isdigit() or e.startswith("GPU-"), (e.strip() for e in entries))
    return [nvml.nvmlDeviceGetHandleByIndex(int(e)) if e.isdigit() else nvml.nvmlDeviceGetHandleByUUID(e) for e in ids]


class AmdSmiSource(_LibrarySource):
    """AMD GPUs through amdsmi: every GPU it sees."""

    label = "amdsmi (ROCm)"
    _module, _install = "amdsmi", "it ships with ROCm"
    _error_class, _init_call, _shutdown_call = "AmdSmiException", "amdsmi_init", "amdsmi_shut_down"

    def _find(self) -> list[_Device]:
        amd = self._lib
        return [_Device(h, i, str(amd.amdsmi_get_gpu_asic_info(h)["market_name"]),
                        self._has_counter(partial(amd.amdsmi_get_energy_count, h)))
                for i, h in enumerate(amd.amdsmi_get_processor_handles())]

    def _read(self, device: _Device) -> GpuReading:
        amd, h = self._lib, device.handle
        # Which fields a GPU reports depends on its generation (current_socket_power from MI300 on,
        # average_socket_power before): a field it lacks reads "N/A" or raises, and is None here.
        power = self._field(partial(amd.amdsmi_get_power_info, h), "current_socket_power", "average_socket_power")
        energy = amd.amdsmi_get_energy_count(h) if device.has_energy_counter else {}
        counts, resolution_uj = _number(energy, "energy_accumulator"), _number(energy, "counter_resolution")
        vram_mib = self._field(partial(amd.amdsmi_get_gpu_vram_usage, h), "vram_used")
        activity = self._field(partial(amd.amdsmi_get_gpu_activity, h), "gfx_activity")
        return GpuReading(
            index=device.index, name=device.name, power_w=power,
            energy_j=None if counts is None or resolution_uj is None else counts * resolution_uj / 1e6,
            sm_clock_mhz=self._field(partial(amd.amdsmi_get_clock_info, h, amd.AmdSmiClkType.GFX), "clk"),
            memory_used_bytes=None if vram_mib is None else int(vram_mib) * 2**20,
            utilization=None if activity is None else activity / 100)

    def _field(self, call: Callable[[], dict[str, Any]], *keys: str) -> float | None:
        try:
            values = call()
        except self._error:
            return None
        return next((v for v in (_number(values, key) for key in keys) if v is not None), None)


def _number(values: dict[str, Any], key: str) -> float | None:
    """A reported number; amdsmi writes "N/A", or leaves UINT32_MAX, for what a GPU lacks."""
    value = values.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == 0xFFFFFFFF:
        return None
    return float(value)


# Prometheus name -> (GpuReading field, factor to the field's unit)
_SERVER_METRICS = {
    "agentload:gpu_power_watts": ("power_w", 1.0),
    "agentload:gpu_energy_joules_total": ("energy_j", 1.0),
    "agentload:gpu_sm_clock_mhz": ("sm_clock_mhz", 1.0),
    "agentload:gpu_memory_used_bytes": ("memory_used_bytes", 1.0),
    "agentload:gpu_utilization_ratio": ("utilization", 1.0),
}
_DCGM_METRICS = {
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),  # mJ
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", 2.0**20),  # MiB
    "DCGM_FI_DEV_GPU_UTIL": ("utilization", 0.01),  # %
}
SERVER_FAMILY, DCGM_FAMILY = "our server's agentload:gpu_* metrics", "a DCGM exporter"
# (family, its metrics, the label naming the GPU model)
_FAMILIES = ((SERVER_FAMILY, _SERVER_METRICS, "name"), (DCGM_FAMILY, _DCGM_METRICS, "modelName"))


def readings_from_prometheus(text: str) -> tuple[str, list[GpuReading]]:
    """The GPU readings in one scrape, by GPU index, from the first family it holds: (family, readings);
    ("", []) when it holds neither."""
    for family, metrics, name_label in _FAMILIES:
        gpus: dict[int, dict[str, Any]] = {}
        for metric, labels, value in _prometheus_samples(text, metrics):
            if "gpu" in labels:
                field, factor = metrics[metric]
                gpus.setdefault(int(labels["gpu"]), {"name": labels.get(name_label, "unknown")})[field] = value * factor
        if gpus:
            return family, [_prometheus_reading(index, fields) for index, fields in sorted(gpus.items())]
    return "", []


def _prometheus_reading(index: int, fields: dict[str, Any]) -> GpuReading:
    memory = fields.get("memory_used_bytes")
    return GpuReading(index=index, name=fields["name"], power_w=fields.get("power_w"),
                      energy_j=fields.get("energy_j"), sm_clock_mhz=fields.get("sm_clock_mhz"),
                      memory_used_bytes=None if memory is None else round(memory),
                      utilization=fields.get("utilization"))


_SAMPLE_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _prometheus_samples(text: str, names: Collection[str]) -> list[tuple[str, dict[str, str], float]]:
    """The named metrics' samples in Prometheus text as (name, labels, value): a small reader kept to this one
    function until loadgen/telemetry/prometheus.py's parser replaces it. Label values stay escaped and
    timestamps are dropped; a value that does not parse raises ValueError."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE_LINE.match(line)
        if match and match.group(1) in names:
            samples.append((match.group(1), dict(_LABEL_PAIR.findall(match.group(2) or "")), float(match.group(3))))
    return samples


class PrometheusGpuSource:
    """GPU readings scraped from Prometheus text at `url`: our server's /metrics or a DCGM exporter's."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._family = ""
        self._last: list[GpuReading] = []
        self.read()  # fails here when the URL has no GPU metrics

    def read(self) -> list[GpuReading]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                family, readings = readings_from_prometheus(response.read().decode("utf-8", "replace"))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise GpuTelemetryError(f"{self.url}: {exc}") from exc
        if not readings:
            raise GpuTelemetryError(f"{self.url}: no agentload:gpu_* or DCGM_FI_DEV_* GPU metrics")
        self._family, self._last = family, readings
        return readings

    def describe(self) -> str:
        gpus = _gpus_text([(r.index, r.name, r.energy_j is not None) for r in self._last])
        # A DCGM exporter refreshes its readings at its own collection interval, not at each scrape.
        cadence = "; readings as fresh as the exporter's collection interval" if self._family == DCGM_FAMILY else ""
        return f"{self._family} at {self.url}: {gpus}{cadence}"

    def close(self) -> None:
        pass


def _gpus_text(gpus: Sequence[tuple[int, str, bool]]) -> str:
    """'GPUs 0, 1 (model); energy from ...' for (index, name, has an energy counter) triples."""
    indices = ", ".join(str(index) for index, _, _ in gpus)
    names = ", ".join(sorted({name for _, name, _ in gpus}))
    counters = sum(has_counter for _, _, has_counter in gpus)
    if counters == len(gpus):
        energy = "energy from the GPUs' cumulative energy counters"
    elif counters == 0:
        energy = "energy integrated from power readings (no energy counter)"
    else:
        energy = f"energy from the energy counter on {counters} of {len(gpus)} GPUs, from power readings on the rest"
    return f"GPU{'s' if len(gpus) > 1 else ''} {indices} ({names}); {energy}"


def _import(module: str, missing: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as exc:  # amdsmi loads its shared library on import
        raise GpuTelemetryError(f"{missing}: {exc}") from None


def _metrics_url(url: str) -> str:
    """An exporter's URL, with /metrics as its path when it has none."""
    stripped = url.rstrip("/")
    return stripped if urllib.parse.urlsplit(stripped).path else stripped + "/metrics"


def _server_metrics_url(base_url: str) -> str:
    """The /metrics of the server at `base_url`, the URL its /v1 routes hang from."""
    return base_url.rstrip("/") + "/metrics"


def choose_source(spec: str | None, server_url: str | None) -> GpuSource:
    """The source `--gpu-telemetry` names: auto (the default), nvml, amdsmi, server, off, or an http(s) URL.
    auto takes NVML if it loads and sees a GPU, else amdsmi, else the server's /metrics if it exports GPU
    metrics, else a NoGpuSource whose describe() says why each was passed over. A named source that cannot be
    opened raises UsageError. Blocking (it loads libraries and may scrape), so call it off the event loop."""
    choice = spec or "auto"
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
    raise UsageError(f"--gpu-telemetry: expected {SPEC_CHOICES}, got {choice!r}")


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
