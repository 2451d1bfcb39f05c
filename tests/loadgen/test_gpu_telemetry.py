"""GPU telemetry: NVML, amdsmi and Prometheus (our server's, a DCGM exporter's) sources give exact readings,
`choose_source` picks and explains, and the sampler's window arithmetic (energy counter difference, power
trapezoid, per token, per request, per kW) states what is missing instead of reporting 0."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadgen.errors import UsageError
from loadgen.telemetry.gpu import GpuSampler, choose_source
from loadgen.telemetry.gpu_prometheus import DCGM_FAMILY, SERVER_FAMILY, PrometheusGpuSource, readings_from_prometheus
from loadgen.telemetry.gpu_sources import AmdSmiSource, GpuReading, GpuTelemetryError, NoGpuSource, NvmlSource
from server.engine.messages import EngineStats
from server.gpu_metrics import GpuGauges
from server.metrics import ServerMetrics
from tests.fake_gpu import FakeAmdSmi, FakeGpu, FakePynvml

DCGM_TEXT = (Path(__file__).parent / "data" / "dcgm_exporter_metrics.txt").read_text()
H100 = "NVIDIA H100 80GB HBM3"
S = 1_000_000_000  # ns


def _gpus() -> list[FakeGpu]:
    return [FakeGpu(H100, power_w=700.5, energy_j=123456.789, sm_clock_mhz=1980, memory_used_bytes=70 * 2**30,
                    utilization_pct=93, uuid="GPU-aaaa"),
            FakeGpu(H100, power_w=68.25, energy_j=None, sm_clock_mhz=345, memory_used_bytes=2**20,
                    utilization_pct=0, uuid="GPU-bbbb")]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
    fake = FakePynvml(_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


@pytest.fixture
def no_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither pynvml nor amdsmi imports (None in sys.modules makes the import fail)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)


class _Metrics(BaseHTTPRequestHandler):
    text = ""

    def do_GET(self) -> None:
        body = self.text.encode() if self.path == "/metrics" else b""
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve_metrics() -> Iterator[Callable[[str], str]]:
    """serve_metrics(text) -> the base URL of a server whose /metrics answers `text`."""
    servers = []

    def serve(text: str) -> str:
        handler = type("Handler", (_Metrics,), {"text": text})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_nvml_source_reads_the_gpus_in_nvml_units(nvml):
    source = NvmlSource()
    assert source.read() == [
        GpuReading(index=0, name=H100, power_w=700.5, energy_j=123456.789, sm_clock_mhz=1980.0,
                   memory_used_bytes=70 * 2**30, utilization=0.93),
        GpuReading(index=1, name=H100, power_w=68.25, energy_j=None, sm_clock_mhz=345.0,
                   memory_used_bytes=2**20, utilization=0.0),
    ]
    assert source.describe() == (f"NVML (nvidia-ml-py): GPUs 0, 1 ({H100}); energy from the energy counter on 1 "
                                 "of 2 GPUs, from power readings on the rest")
    source.close()
    source.close()
    assert nvml.initialised == 0


def test_nvml_source_reads_the_gpus_cuda_visible_devices_names(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1, GPU-aaaa,-1,0")  # CUDA ignores everything from -1 on
    source = NvmlSource()
    assert [reading.index for reading in source.read()] == [1, 0]
    assert source.describe().startswith(f"NVML (nvidia-ml-py): GPUs 1, 0 ({H100});")


def test_nvml_source_fails_without_a_driver_a_gpu_or_the_module(nvml, monkeypatch):
    nvml.driver = False
    with pytest.raises(GpuTelemetryError, match=r"^NVML \(nvidia-ml-py\): Driver Not Loaded$"):
        NvmlSource()
    nvml.driver = True
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(GpuTelemetryError, match=r"no GPU \(CUDA_VISIBLE_DEVICES=''\)"):
        NvmlSource()
    assert nvml.initialised == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuTelemetryError, match=r"^NVML \(nvidia-ml-py\): cannot import pynvml \(pip install 'agen"):
        NvmlSource()


@pytest.mark.parametrize("before_mi300", [False, True])
def test_amdsmi_source_reads_the_gpus_in_amdsmi_units(monkeypatch, before_mi300):
    gpus = [FakeGpu("AMD Instinct MI300X", power_w=640, energy_j=3000.0, sm_clock_mhz=2100,
                    memory_used_bytes=150_000 * 2**20, utilization_pct=88),
            FakeGpu("AMD Instinct MI300X", power_w=140, energy_j=None, sm_clock_mhz=140, memory_used_bytes=0,
                    utilization_pct=0)]
    fake = FakeAmdSmi(gpus, before_mi300=before_mi300)
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    source = AmdSmiSource()
    assert source.read() == [
        GpuReading(index=0, name="AMD Instinct MI300X", power_w=640.0, energy_j=3000.0, sm_clock_mhz=2100.0,
                   memory_used_bytes=150_000 * 2**20, utilization=0.88),
        GpuReading(index=1, name="AMD Instinct MI300X", power_w=140.0, energy_j=None, sm_clock_mhz=140.0,
                   memory_used_bytes=0, utilization=0.0),
    ]
    assert source.describe().startswith("amdsmi (ROCm): GPUs 0, 1 (AMD Instinct MI300X); energy from the energy "
                                        "counter on 1 of 2 GPUs")
    source.close()
    assert fake.initialised == 0


def test_amdsmi_fields_a_gpu_lacks_are_none(monkeypatch):
    fake = FakeAmdSmi([FakeGpu("AMD Instinct MI250X", 300, 10.0, 1700, 0, 50)])
    fake.amdsmi_get_gpu_activity = lambda gpu: {"gfx_activity": "N/A"}

    def no_clock(gpu, clock):
        raise fake.AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")

    fake.amdsmi_get_clock_info = no_clock
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    (reading,) = AmdSmiSource().read()
    assert reading.utilization is None and reading.sm_clock_mhz is None
    assert reading.power_w == 300.0 and reading.energy_j == 10.0


def test_dcgm_exporter_exposition_parses():
    family, readings = readings_from_prometheus(DCGM_TEXT)
    assert family == DCGM_FAMILY
    assert readings == [
        GpuReading(index=0, name=H100, power_w=612.25, energy_j=319159391.25, sm_clock_mhz=1980.0,
                   memory_used_bytes=72769 * 2**20, utilization=0.97),
        GpuReading(index=1, name=H100, power_w=71.5, energy_j=28000000.5, sm_clock_mhz=345.0,
                   memory_used_bytes=0, utilization=0.0),
    ]


def test_older_dcgm_labels_with_spaces_and_no_model_parse():
    text = ('DCGM_FI_DEV_POWER_USAGE{gpu="3", UUID="GPU-8c16", device="nvidia3"} 23.528000\n'
            'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="3", UUID="GPU-8c16", device="nvidia3"} 31035686671 1700000000\n')
    assert readings_from_prometheus(text) == (DCGM_FAMILY, [
        GpuReading(index=3, name="unknown", power_w=23.528, energy_j=31035686.671, sm_clock_mhz=None,
                   memory_used_bytes=None, utilization=None)])


def test_our_servers_exposition_round_trips(nvml):
    """What server/metrics.py writes from NVML is what loadgen reads back."""
    text = ServerMetrics("m").render(EngineStats(), 0, GpuGauges(2).read()).decode()
    family, readings = readings_from_prometheus(text)
    assert family == SERVER_FAMILY
    assert readings == NvmlSource().read()


def test_prometheus_source_scrapes_a_url(serve_metrics):
    url = serve_metrics(DCGM_TEXT)
    source = PrometheusGpuSource(url + "/metrics")
    assert [reading.power_w for reading in source.read()] == [612.25, 71.5]
    assert source.describe() == (f"a DCGM exporter at {url}/metrics: GPUs 0, 1 ({H100}); energy from the GPUs' "
                                 "cumulative energy counters; readings as fresh as the exporter's collection interval")


def test_prometheus_source_fails_on_a_page_without_gpu_metrics_or_no_server(serve_metrics):
    url = serve_metrics("vllm:num_requests_running 0\n")
    with pytest.raises(GpuTelemetryError, match="no agentload:gpu_\\* or DCGM_FI_DEV_\\* GPU metrics"):
        PrometheusGpuSource(url + "/metrics")
    with pytest.raises(GpuTelemetryError, match="HTTP Error 404"):
        PrometheusGpuSource(url + "/elsewhere")


def test_choose_source_auto_prefers_nvml(nvml, serve_metrics):
    source = choose_source(None, serve_metrics(DCGM_TEXT))
    assert isinstance(source, NvmlSource)


def test_choose_source_auto_falls_back_to_amdsmi(no_libraries, monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([FakeGpu("AMD Instinct MI300X", 600, 1.0, 2100, 0, 1)]))
    assert isinstance(choose_source("auto", None), AmdSmiSource)


def test_choose_source_auto_falls_back_to_the_servers_metrics(no_libraries, nvml, serve_metrics, monkeypatch):
    # The server has NVML (its gauges read before pynvml is hidden from this process).
    text = ServerMetrics("m").render(EngineStats(), 0, GpuGauges(2).read()).decode()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    url = serve_metrics(text)
    source = choose_source("auto", url)
    assert isinstance(source, PrometheusGpuSource)
    assert source.describe().startswith(f"{SERVER_FAMILY} at {url}/metrics: GPUs 0, 1")


def test_choose_source_auto_says_why_there_is_none(no_libraries, serve_metrics):
    url = serve_metrics("vllm:num_requests_running 0\n")
    source = choose_source("auto", url)
    assert isinstance(source, NoGpuSource)
    assert source.read() == []
    why = source.describe()
    assert why.startswith("no GPU telemetry: NVML (nvidia-ml-py): cannot import pynvml (pip install 'agentload[gpu]')")
    assert "; amdsmi (ROCm): cannot import amdsmi (it ships with ROCm)" in why
    assert why.endswith(f"; {url}/metrics: no agentload:gpu_* or DCGM_FI_DEV_* GPU metrics")
    in_process = choose_source("auto", None).describe()
    assert in_process.endswith("; no server /metrics to scrape (the engine runs in this process)")


def test_choose_source_named(serve_metrics, no_libraries):
    url = serve_metrics(DCGM_TEXT)
    assert choose_source("off", url).describe() == "no GPU telemetry: --gpu-telemetry off"
    assert isinstance(choose_source(url, None), PrometheusGpuSource)  # /metrics added to a bare exporter URL
    with pytest.raises(UsageError, match=r"--gpu-telemetry nvml: NVML \(nvidia-ml-py\): cannot import pynvml"):
        choose_source("nvml", url)
    with pytest.raises(UsageError, match="--gpu-telemetry server: there is no server to scrape"):
        choose_source("server", None)
    with pytest.raises(UsageError, match="--gpu-telemetry server: .*no agentload:gpu_"):
        choose_source("server", serve_metrics("up 1\n"))
    with pytest.raises(UsageError, match="--gpu-telemetry: expected auto, nvml, amdsmi, server, off or"):
        choose_source("dcgm", url)


class _Scripted:
    """A source that answers each read with the next of `reads` (an exception is raised)."""

    def __init__(self, reads: list[list[GpuReading] | Exception]) -> None:
        self.reads = iter(reads)
        self.closed = False

    def read(self) -> list[GpuReading]:
        result = next(self.reads)
        if isinstance(result, Exception):
            raise result
        return result

    def describe(self) -> str:
        return "scripted"

    def close(self) -> None:
        self.closed = True


def _reading(index: int, power_w: float | None, energy_j: float | None, clock: float = 1500.0,
             memory: int = 2**30, utilization: float = 0.5) -> GpuReading:
    return GpuReading(index, "gpu", power_w, energy_j, clock, memory, utilization)


def _sampled(reads: list[list[GpuReading] | Exception], times_s: list[float]) -> GpuSampler:
    """A sampler that took one sample per read, each at its time (the clock is read twice a sample)."""
    clock = iter([round(t * S) for t in times_s for _ in range(2)])
    sampler = GpuSampler(_Scripted(reads), clock=lambda: next(clock))
    for _ in reads:
        sampler.sample()
    return sampler


def test_window_energy_from_counters_interpolated_at_its_ends():
    # GPU 0 draws 300 W and GPU 1 100 W by their counters; their power readings are off on purpose.
    reads = [[_reading(0, 1.0, 1000 + 300 * t), _reading(1, 1.0, 5000 + 100 * t)] for t in range(5)]
    window = _sampled(reads, [0, 1, 2, 3, 4]).window(round(0.5 * S), round(3.5 * S), output_tokens=600,
                                                    requests=12)
    assert [(gpu.index, gpu.energy_j, gpu.avg_watts, gpu.energy_from) for gpu in window.gpus] == [
        (0, 900.0, 300.0, "counter"), (1, 300.0, 100.0, "counter")]
    assert window.duration_s == 3.0
    assert window.energy_j == 1200.0
    assert window.avg_watts_per_gpu == 200.0
    assert window.joules_per_output_token == 2.0
    assert window.joules_per_request == 100.0
    assert window.output_tokens_per_s_per_kw == 500.0  # 200 tok/s at 0.4 kW
    assert window.missing == () and window.failed_reads == 0 and window.source == "scripted"


def test_window_energy_from_the_power_trapezoid_without_a_counter():
    reads = [[_reading(0, watts, None, clock=clock, memory=memory, utilization=util)]
             for watts, clock, memory, util in ((100, 1000, 5, 0.25), (200, 2000, 9, 0.5), (300, 1500, 7, 0.75))]
    window = _sampled(reads, [0, 1, 2]).window(0, 2 * S, output_tokens=40, requests=4)
    (gpu,) = window.gpus
    assert (gpu.energy_j, gpu.avg_watts, gpu.energy_from) == (400.0, 200.0, "power")  # 150 J + 250 J
    assert (gpu.mean_sm_clock_mhz, gpu.max_memory_used_bytes, gpu.mean_utilization) == (1500.0, 9, 0.5)
    assert (window.joules_per_output_token, window.joules_per_request) == (10.0, 100.0)
    assert window.output_tokens_per_s_per_kw == 100.0


def _all_none(window) -> bool:
    return all(value is None for value in (window.energy_j, window.avg_watts_per_gpu, window.joules_per_output_token,
                                           window.joules_per_request, window.output_tokens_per_s_per_kw))


def test_window_without_telemetry_states_why_never_zero():
    sampler = GpuSampler(NoGpuSource("no GPU telemetry: --gpu-telemetry off"))
    sampler.start()
    sampler.stop()
    window = sampler.window(0, S, output_tokens=100, requests=1)
    assert _all_none(window) and window.gpus == ()
    assert window.missing == ("no GPU telemetry: --gpu-telemetry off",)


def test_window_not_covered_by_samples_states_the_failed_reads():
    reads = [[_reading(0, 100, 0.0)], GpuTelemetryError("http://h/metrics: timed out")]
    window = _sampled(reads, [0, 1]).window(0, 2 * S, output_tokens=100, requests=1)
    assert _all_none(window)
    assert window.failed_reads == 1
    assert window.missing == ("no GPU energy: no sample at or after its end covers the window (failed reads in the "
                              "window: 1, the last: http://h/metrics: timed out)",)


def test_window_missing_pieces_are_named():
    reset = [[_reading(0, 100, 500.0)], [_reading(0, 100, 10.0)], [_reading(0, 100, 20.0)]]
    window = _sampled(reset, [0, 1, 2]).window(0, 2 * S, output_tokens=10, requests=1)
    assert _all_none(window) and window.gpus[0].energy_j is None
    assert window.missing == ("GPU 0: its energy counter went backwards (reset) in the window",)

    neither = [[_reading(0, None, None)], [_reading(0, None, None)]]
    window = _sampled(neither, [0, 1]).window(0, S, output_tokens=10, requests=1)
    assert window.missing == ("GPU 0: neither an energy counter nor power in every sample around the window",)

    vanished = [[_reading(0, 100, 0.0), _reading(1, 100, 0.0)], [_reading(0, 100, 100.0)]]
    window = _sampled(vanished, [0, 1]).window(0, S, output_tokens=10, requests=1)
    assert window.energy_j is None and window.gpus[0].energy_j == 100.0
    assert window.missing == ("GPU 1: missing from the samples around the window's start or end",)

    idle = [[_reading(0, 100, 50.0)], [_reading(0, 100, 150.0)]]
    window = _sampled(idle, [0, 1]).window(0, S, output_tokens=0, requests=0)
    assert window.energy_j == 100.0 and window.joules_per_output_token is None and window.joules_per_request is None
    assert window.output_tokens_per_s_per_kw == 0.0
    assert window.missing == ("joules per output token: no output tokens in the window",
                              "joules per request: no requests in the window")


def test_sampler_thread_samples_until_stopped_and_closes_the_source():
    source = _Scripted([[_reading(0, 100, float(n))] for n in range(10_000)])
    sampler = GpuSampler(source, interval_s=0.005)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    start, end = sampler.samples[0].t_ns, sampler.samples[-1].t_ns
    assert len(sampler.samples) >= 3 and source.closed
    assert [s.t_ns for s in sampler.samples] == sorted(s.t_ns for s in sampler.samples)
    assert sampler.window(start, end, output_tokens=1, requests=1).energy_j is not None


def test_a_replay_reports_each_levels_energy_per_token(start_server, sessions, replay, monkeypatch):
    # a GPU drawing a steady 300 W whose energy counter grows with the clock: the window's joules
    # per output token are 300 W x the window over its output tokens
    from tests.fake_gpu import FakeGpu, FakePynvml

    began = time.monotonic()

    class Steady(FakePynvml):
        def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
            return round((1000.0 + 300.0 * (time.monotonic() - began)) * 1000)

    monkeypatch.setitem(sys.modules, "pynvml", Steady([FakeGpu("Fake H200", 300.0, 0.0, 1980, 2**30, 50)]))
    server = start_server(first_ms=2, itl_ms=2)
    code, doc, _ = replay(server.url, "--traces", str(sessions({"n_requests": 40, "think": 0.0})), "--duration", "3")
    assert code == 0
    level = doc["levels"][0]
    gpu, tokens = level["gpu"], level["counts"]["output_tokens"]
    assert doc["config"]["gpu_telemetry"].startswith("NVML (nvidia-ml-py): GPU 0 (Fake H200)")
    assert gpu["energy_j"] == pytest.approx(300.0 * level["window_s"], rel=0.02)
    assert gpu["avg_watts_per_gpu"] == pytest.approx(300.0, rel=0.02) and gpu["missing"] == []
    assert gpu["joules_per_output_token"] == pytest.approx(gpu["energy_j"] / tokens)
    assert gpu["joules_per_request"] == pytest.approx(gpu["energy_j"] / level["counts"]["requests_ok"])
    assert gpu["output_tokens_per_s_per_kw"] == pytest.approx(tokens / level["window_s"] / 0.3, rel=0.02)
    assert set(gpu["series"]["power_w"]) == {"0"} and len(gpu["series"]["t_s"]) >= 3


def test_a_replay_without_gpu_telemetry_states_it(start_server, sessions, replay):
    server = start_server(first_ms=2, itl_ms=2)
    code, doc, _ = replay(server.url, "--traces", str(sessions({"n_requests": 6, "think": 0.0})), "--duration", "0.5",
                          "--gpu-telemetry", "off")
    assert code == 0
    gpu = doc["levels"][0]["gpu"]
    assert gpu["energy_j"] is None and gpu["missing"] == ["no GPU telemetry: --gpu-telemetry off"]
