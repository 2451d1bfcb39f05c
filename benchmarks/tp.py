"""Tensor-parallel benchmark (two H200s, not run by CI): TP 1 against TP 2 on the same model.

Two measurements per tensor-parallel size N in --tps:
- decode step: the wall time of one `Engine.step()` with --batch requests of --context prompt
  tokens each, in this process (rank 0 here, the other ranks spawned by the engine). The prompts
  are really prefilled first; the median of --steps timed decode steps after --warmup ones.
- serving: `server start --tp N` on 127.0.0.1, then `loadgen replay --conc C` over the bundled
  agentic traces scaled to the model's context; throughput per GPU (the server's GPUs = N), TTFT
  and TPOT from the result file.

One command, one table (and a JSON file with every number when --out is given):

    PYTHONPATH=. python benchmarks/tp.py                   # small, TP 1 and 2, --conc 16
    PYTHONPATH=. python benchmarks/tp.py --model v32 --num-layers 4 --tps 1,2
    PYTHONPATH=. python benchmarks/tp.py --smoke           # tiny model on CPU (gloo): tests this script

NCCL multicast stays off (server/distributed/settings.py sets NCCL_NVLS_ENABLE=0 and the other switches in
every rank unless the environment already says otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import torch  # noqa: E402

from server.config import CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig, model_preset  # noqa: E402
from server.distributed.settings import disable_multicast  # noqa: E402
from server.engine.core import Engine  # noqa: E402
from server.engine.messages import AddRequest, SamplingParams  # noqa: E402

_READY = re.compile(r"ready at (http://\S+) ")


@dataclass(frozen=True)
class Row:
    tp: int
    gpus: int
    decode_step_ms: float
    decode_tok_s_per_gpu: float
    output_tok_s_per_gpu: float | None
    total_tok_s_per_gpu: float | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    requests_ok: int | None
    errors: int | None


def engine_config(args: argparse.Namespace, tp: int) -> EngineConfig:
    overrides = {"num_layers": args.num_layers} if args.num_layers else {}
    model = model_preset(args.model, **overrides)
    max_len = args.context + args.warmup + args.steps + 2
    return EngineConfig(
        model=model,
        cache=CacheConfig(block_size=model.default_block_size, kv_cache_dtype=args.kv_cache_dtype,
                          enable_prefix_caching=False,
                          num_blocks=args.batch * -(-max_len // model.default_block_size) + 1),
        scheduler=SchedulerConfig(max_num_seqs=args.batch, max_model_len=max_len,
                                  max_num_batched_tokens=max(args.batch, args.prefill_budget)),
        device=args.device, seed=0, parallel=ParallelConfig(tensor_parallel_size=tp),
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_step_s(args: argparse.Namespace, tp: int) -> tuple[float, int]:
    """(median decode step seconds, GPUs) for --batch requests at --context tokens."""
    engine = Engine(engine_config(args, tp))
    try:
        gen = torch.Generator().manual_seed(0)
        params = SamplingParams(max_tokens=args.warmup + args.steps + 1, temperature=0.0, ignore_eos=True)
        for i in range(args.batch):
            ids = torch.randint(0, 256, (args.context,), generator=gen).tolist()
            engine.add_request(AddRequest(f"d{i}", tuple(ids), params, 0.0))
        while any(s.num_output_tokens == 0 for s in engine.seqs.values()):  # prefill, in chunks
            engine.step()
        times = []
        for i in range(args.warmup + args.steps):
            sync(engine.runner.device)
            start = time.perf_counter()
            engine.step()  # ends in the sampled tokens' host copy, so the device work is done
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times), engine.runner.num_gpus
    finally:
        engine.runner.close()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _pythonpath() -> str:
    """The repo first, then whatever the caller's PYTHONPATH holds (e.g. carried wheels)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def start_server(args: argparse.Namespace, tp: int, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "server.cli", "start", "--port", "0", "--model", args.model,
           "--device", args.device, "--tp", str(tp), "--kv-cache-dtype", args.kv_cache_dtype,
           "--max-model-len", str(args.max_context + 1024), "--max-num-seqs", str(args.max_num_seqs)]
    if args.num_layers:
        cmd += ["--num-layers", str(args.num_layers)]
    env = dict(os.environ, PYTHONPATH=_pythonpath(), PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        match = _READY.search(log.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"server --tp {tp} exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server --tp {tp} not ready after 600 s:\n{log.read_text(errors='replace')}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def replay(args: argparse.Namespace, tp: int, gpus: int, work: Path) -> dict:
    """The result file's level of one `loadgen replay` against `server start --tp tp`."""
    proc, url = start_server(args, tp, work / f"server-tp{tp}.log")
    try:
        out = work / f"replay-tp{tp}"
        done = subprocess.run(
            [sys.executable, "-m", "loadgen.cli", "replay", "--url", url, "--conc", str(args.conc),
             "--gpus", str(max(gpus, 1)), "--max-context", str(args.max_context),
             "--token-scale", str(args.token_scale), "--think-time-scale", str(args.think_time_scale),
             "--duration", str(args.duration), "--warmup", args.replay_warmup, "--out", str(out), "--quiet"],
            cwd=REPO, env=dict(os.environ, PYTHONPATH=_pythonpath()), capture_output=True, text=True,
            timeout=args.duration * 4 + 600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"loadgen replay against --tp {tp} failed ({done.returncode}):\n{done.stderr}")
        (level,) = orjson.loads((out / "result.json").read_bytes())["levels"]
        return level
    finally:
        stop_server(proc)


def ms(stats: dict, key: str) -> float | None:
    value = stats.get(key)
    return None if value is None else value / 1000.0  # microseconds -> ms


def measure(args: argparse.Namespace, tp: int, work: Path) -> Row:
    progress(f"TP {tp}: decode steps (batch {args.batch}, context {args.context})")
    step_s, gpus = decode_step_s(args, tp)
    level = None
    if not args.skip_replay:
        progress(f"TP {tp}: loadgen replay --conc {args.conc} for {args.duration} s")
        level = replay(args, tp, gpus, work)
    per_gpu = max(gpus, 1)
    tput = level["throughput"] if level else {}
    metrics = level["metrics"] if level else {}
    ttft, tpot = metrics.get("ttft", {}).get("stats", {}), metrics.get("tpot", {}).get("stats", {})
    return Row(
        tp=tp, gpus=gpus, decode_step_ms=step_s * 1000, decode_tok_s_per_gpu=args.batch / step_s / per_gpu,
        output_tok_s_per_gpu=tput.get("output_tokens_per_s_per_gpu"),
        total_tok_s_per_gpu=tput.get("total_tokens_per_s_per_gpu"),
        ttft_p50_ms=ms(ttft, "p50"), tpot_p50_ms=ms(tpot, "p50"), tpot_p90_ms=ms(tpot, "p90"),
        requests_ok=level["counts"]["requests_ok"] if level else None,
        errors=level["counts"]["errors_total"] if level else None,
    )


def print_table(args: argparse.Namespace, rows: list[Row]) -> None:
    print(f"model {args.model} ({args.device}), kv {args.kv_cache_dtype}; decode: batch {args.batch} x "
          f"context {args.context}; replay: --conc {args.conc}, --max-context {args.max_context}, "
          f"--token-scale {args.token_scale}, {args.duration} s window")
    header = ("TP", "GPUs", "decode step ms", "decode tok/s/GPU", "replay out tok/s/GPU",
              "replay total tok/s/GPU", "TTFT p50 ms", "TPOT p50 ms", "TPOT p90 ms", "ok", "errors")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    for r in rows:
        print(" | ".join(fmt(getattr(r, f.name)) for f in dataclasses.fields(r)))


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"[tp] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", help="model preset (default: small)")
    p.add_argument("--num-layers", type=int, default=None, help="override the preset's layer count")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--tps", default="1,2", help="tensor-parallel sizes to compare (default: 1,2)")
    p.add_argument("--kv-cache-dtype", default="bf16", choices=("bf16", "fp8"))
    p.add_argument("--batch", type=int, default=16, help="decode batch (default: 16)")
    p.add_argument("--context", type=int, default=4096, help="prompt tokens per decode request (default: 4096)")
    p.add_argument("--prefill-budget", type=int, default=8192, help="tokens per prefill step (default: 8192)")
    p.add_argument("--warmup", type=int, default=10, help="untimed decode steps (default: 10)")
    p.add_argument("--steps", type=int, default=50, help="timed decode steps (default: 50)")
    p.add_argument("--conc", type=int, default=16, help="loadgen replay --conc (default: 16)")
    p.add_argument("--max-context", type=int, default=16384, help="trace context cap in tokens (default: 16384)")
    p.add_argument("--token-scale", type=float, default=0.25, help="trace token scale (default: 0.25)")
    p.add_argument("--think-time-scale", type=float, default=0.1, help="trace think-time scale (default: 0.1)")
    p.add_argument("--duration", type=float, default=60.0, help="replay window in seconds (default: 60)")
    p.add_argument("--replay-warmup", default="20s", help="loadgen replay --warmup (default: 20s)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="server --max-num-seqs (default: 64)")
    p.add_argument("--skip-replay", action="store_true", help="decode-step timing only")
    p.add_argument("--out", default=None, help="also write every row as JSON to this file")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model on CPU, few steps, a 3 s replay: checks that the script runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.device, args.batch, args.context, args.prefill_budget = "tiny", "cpu", 4, 64, 256
        args.warmup, args.steps, args.conc, args.max_context, args.token_scale = 1, 3, 2, 1024, 0.02
        args.think_time_scale, args.duration, args.replay_warmup = 0.01, 3.0, "0s"
    try:
        args.tp_sizes = [int(x) for x in args.tps.split(",")]
    except ValueError:
        p.error(f"--tps: expected comma-separated integers, got {args.tps!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    disable_multicast()
    rows = []
    with tempfile.TemporaryDirectory(prefix="agentload-tp-") as tmp:
        for tp in args.tp_sizes:
            rows.append(measure(args, tp, Path(tmp)))
    print_table(args, rows)
    if args.out:
        Path(args.out).write_bytes(orjson.dumps([dataclasses.asdict(r) for r in rows], option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
