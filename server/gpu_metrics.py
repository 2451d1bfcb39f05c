"""The engine's GPUs in /metrics: power, energy, SM clock, memory used and utilisation of each, read through NVML
(nvidia-ml-py) at scrape time, so that loadgen on another host can measure energy per token from them
(loadgen/telemetry/gpu.py reads them back).

The API process reads them, not the engine process, so the step loop is untouched, and it hands each read to a
worker thread because NVML calls block. NVML loads on the first scrape. On CPU, without nvidia-ml-py or without
a driver the exposition simply lacks these metrics.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

# (name, Prometheus type, help, read(nvml, handle) in the metric's unit)
_METRICS: tuple[tuple[str, str, str, Callable[[Any, Any], float]], ...] = (
    ("agentload:gpu_power_watts", "gauge", "GPU power draw (W).",
     lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1e3),
    ("agentload:gpu_energy_joules_total", "counter", "Energy the GPU consumed since its driver loaded (J).",
     lambda nvml, h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3),
    ("agentload:gpu_sm_clock_mhz", "gauge", "GPU SM clock (MHz).",
     lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
    ("agentload:gpu_memory_used_bytes", "gauge", "GPU memory in use, by every process (bytes).",
     lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used),
    ("agentload:gpu_utilization_ratio", "gauge",
     "Fraction of the driver's last sample period in which a kernel ran on the GPU.",
     lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100),
)
GPU_METRICS = tuple((name, kind, help_text) for name, kind, help_text, _ in _METRICS)

# metric name -> [(NVML index, GPU name, value)]
GpuSamples = dict[str, list[tuple[int, str, float]]]


class GpuGauges:
    """NVML readings of the first `count` GPUs CUDA numbers in this process: the engine's on this node."""

    def __init__(self, count: int) -> None:
        self.enabled = count > 0  # False on CPU, and for good once NVML does not load
        self._count = count
        self._nvml: Any = None
        self._gpus: list[tuple[Any, int, str]] = []  # (handle, NVML index, name)
        self._lock = threading.Lock()  # scrapes may overlap on worker threads

    def read(self) -> GpuSamples:
        """Every metric's samples now; empty when NVML is not there. Blocking: run it off the event loop."""
        with self._lock:
            if self.enabled and self._nvml is None:
                self._open()
        if not self.enabled:
            return {}
        samples: GpuSamples = {}
        for name, _, _, read in _METRICS:
            for handle, index, gpu_name in self._gpus:
                # What a GPU lacks (an energy counter before Volta) is left out, as is a failed read.
                with contextlib.suppress(self._nvml.NVMLError):
                    value = read(self._nvml, handle)
                    samples.setdefault(name, []).append((index, gpu_name, value))
        return samples

    def _open(self) -> None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            self.enabled = False
            return
        try:
            nvml.nvmlInit()
            self._gpus = [(h, nvml.nvmlDeviceGetIndex(h), nvml.nvmlDeviceGetName(h))
                          for h in _engine_handles(nvml, self._count)]
        except nvml.NVMLError:  # no driver, or CUDA_VISIBLE_DEVICES names a GPU NVML does not know
            self.enabled = False
            return
        self._nvml = nvml


def _engine_handles(nvml: Any, count: int) -> list[Any]:
    """The first `count` of CUDA_VISIBLE_DEVICES's indices or UUIDs (every GPU's index when it is unset), as NVML
    handles; NVML's order is CUDA's when CUDA_DEVICE_ORDER=PCI_BUS_ID or all GPUs are one model."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(nvml.nvmlDeviceGetCount()))))
    names = [n.strip() for n in listed.split(",")]
    valid = itertools.islice(itertools.takewhile(lambda n: n.isdigit() or n.startswith("GPU-"), names), count)
    by_index, by_uuid = nvml.nvmlDeviceGetHandleByIndex, nvml.nvmlDeviceGetHandleByUUID
    return [by_index(int(n)) if n.isdigit() else by_uuid(n) for n in valid]
