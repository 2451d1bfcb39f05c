"""GPU readings from Prometheus text: our server's agentload:gpu_* metrics (server/gpu_metrics.py) or a
DCGM exporter's DCGM_FI_DEV_* metrics, scraped over HTTP like any other source's read."""

from __future__ import annotations

import http.client
import urllib.request
from typing import Any

from loadgen.telemetry.gpu_sources import GpuReading, GpuTelemetryError, gpus_text
from loadgen.telemetry.prometheus import scan

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
    ("", []) when it holds neither. ParseError (a ValueError) for a scrape that is not Prometheus text."""
    samples = [(metric, dict(pairs), value) for _, metric, pairs, value, _, _ in scan(text, {})]
    for family, metrics, name_label in _FAMILIES:
        gpus: dict[int, dict[str, Any]] = {}
        for metric, labels, value in samples:
            if metric in metrics and "gpu" in labels:
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
        gpus = gpus_text([(r.index, r.name, r.energy_j is not None) for r in self._last])
        # A DCGM exporter refreshes its readings at its own collection interval, not at each scrape.
        cadence = "; readings as fresh as the exporter's collection interval" if self._family == DCGM_FAMILY else ""
        return f"{self._family} at {self.url}: {gpus}{cadence}"

    def close(self) -> None:
        pass
