"""Fake pynvml and amdsmi modules with known readings, for the GPU telemetry tests of loadgen and the server:
a test puts one into sys.modules under the real module's name. Each answers in its library's units (NVML: mW,
mJ, MHz, bytes, %; amdsmi: W, counter ticks, MHz, MiB, %) and only the calls the telemetry makes."""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass


@dataclass(eq=False)
class FakeGpu:
    name: str
    power_w: float
    energy_j: float | None  # None: no energy counter
    sm_clock_mhz: int
    memory_used_bytes: int
    utilization_pct: int
    uuid: str = ""


class FakePynvml(types.ModuleType):
    """NVML's index of a GPU is its place in `gpus`; its handle is the FakeGpu."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[FakeGpu], driver: bool = True) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.driver = driver
        self.initialised = 0  # nvmlInit calls less nvmlShutdown calls

    def nvmlInit(self) -> None:
        if not self.driver:
            raise self.NVMLError("Driver Not Loaded")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index >= len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, gpu: FakeGpu) -> int:
        return self.gpus.index(gpu)

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return round(gpu.power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        if gpu.energy_j is None:
            raise self.NVMLError("Not Supported")
        return round(gpu.energy_j * 1000)

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return gpu.sm_clock_mhz

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=80 * 2**30, free=80 * 2**30 - gpu.memory_used_bytes,
                                     used=gpu.memory_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=gpu.utilization_pct, memory=0)


class FakeAmdSmi(types.ModuleType):
    """amdsmi's handle of a GPU is the FakeGpu. `before_mi300`: power as average_socket_power, with
    current_socket_power "N/A" (MI300 and later the other way round)."""

    RESOLUTION_UJ = 2.0  # energy counter ticks in µJ

    class AmdSmiException(Exception):
        pass

    class AmdSmiClkType(enum.IntEnum):
        GFX = 0
        MEM = 5

    def __init__(self, gpus: list[FakeGpu], before_mi300: bool = False) -> None:
        super().__init__("amdsmi")
        self.gpus = gpus
        self.before_mi300 = before_mi300
        self.initialised = 0

    def amdsmi_init(self) -> None:
        self.initialised += 1

    def amdsmi_shut_down(self) -> None:
        self.initialised -= 1

    def amdsmi_get_processor_handles(self) -> list[FakeGpu]:
        return list(self.gpus)

    def amdsmi_get_gpu_asic_info(self, gpu: FakeGpu) -> dict[str, object]:
        return {"market_name": gpu.name, "vendor_id": "0x1002", "device_id": "0x74a1"}

    def amdsmi_get_power_info(self, gpu: FakeGpu) -> dict[str, object]:
        power: dict[str, object] = {"current_socket_power": round(gpu.power_w), "average_socket_power": "N/A"}
        if self.before_mi300:
            power = {"current_socket_power": "N/A", "average_socket_power": round(gpu.power_w)}
        return {**power, "gfx_voltage": "N/A", "power_limit": 750}

    def amdsmi_get_energy_count(self, gpu: FakeGpu) -> dict[str, object]:
        if gpu.energy_j is None:
            raise self.AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")
        ticks = round(gpu.energy_j * 1e6 / self.RESOLUTION_UJ)
        return {"power": ticks, "energy_accumulator": ticks, "counter_resolution": self.RESOLUTION_UJ,
                "timestamp": 1}

    def amdsmi_get_clock_info(self, gpu: FakeGpu, clock: AmdSmiClkType) -> dict[str, object]:
        assert clock == self.AmdSmiClkType.GFX
        return {"clk": gpu.sm_clock_mhz, "min_clk": 500, "max_clk": 2100, "clk_locked": 0, "clk_deep_sleep": 0}

    def amdsmi_get_gpu_vram_usage(self, gpu: FakeGpu) -> dict[str, object]:
        return {"vram_total": 196592, "vram_used": gpu.memory_used_bytes // 2**20}

    def amdsmi_get_gpu_activity(self, gpu: FakeGpu) -> dict[str, object]:
        return {"gfx_activity": gpu.utilization_pct, "umc_activity": 12, "mm_activity": "N/A"}
