"""Where GPU readings come from: one reading per GPU per sample (power, cumulative energy, SM clock,
memory used, utilisation), read through NVML (nvidia-ml-py) or amdsmi (ROCm); a field a source does
not report is None. Prometheus text (our server's agentload:gpu_* metrics, a DCGM exporter) is
loadgen/telemetry/gpu_prometheus.py; which source a run reads, loadgen/telemetry/gpu.py.

Reads block (library calls), so sources are read on the sampler's thread, never on the event loop.
The amdsmi path follows amdsmi's documented Python API and is tested against a fake module only,
never on AMD hardware.
"""

from __future__ import annotations

import importlib
import itertools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Protocol


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
        return f"{self.label}: {gpus_text([(d.index, d.name, d.has_energy_counter) for d in self._devices])}"

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



def gpus_text(gpus: Sequence[tuple[int, str, bool]]) -> str:
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
