"""Speculative decoding benchmark (H200, not run by CI): decode tokens/s with and without drafts.

Drives the Engine in-process. For each mode (off, and `--speculative-config` synthetic at k with
the given AL, 3.51 at k=5 by default: DSv4.1-Flash DSpark) and each concurrency C, it adds C
requests with random prompts of `--prompt-len` tokens and a fixed `--output-len` (ignore_eos),
steps until every prompt is prefilled, then times the decode phase to the end. Reported per row:
measured AL (tokens per verify step), mean step time, decode tokens/s per request and per GPU,
and the speed-up over no speculation at the same concurrency. Each verify step really runs k + 1
query tokens per request through the sparse-MLA kernels plus k draft-head passes, so the gain
shown is what the golden AL buys on this engine.

    PYTHONPATH=. python benchmarks/spec_decode.py                       # small, C = 1, 8, 32
    PYTHONPATH=. python benchmarks/spec_decode.py --k 3 --al 2.99 --concurrency 1,16
    PYTHONPATH=. python benchmarks/spec_decode.py --smoke               # tiny on CPU: tests this script
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from server.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig, model_preset  # noqa: E402
from server.engine.core import Engine  # noqa: E402
from server.engine.messages import AddRequest, SamplingParams  # noqa: E402


@dataclass(frozen=True)
class Row:
    mode: str
    concurrency: int
    measured_al: float  # 1.0 without speculation
    step_s: float  # mean decode step time
    tokens: int  # decode tokens generated in `seconds`
    seconds: float
    num_gpus: int

    @property
    def per_request(self) -> float:
        return self.tokens / self.concurrency / self.seconds

    @property
    def per_gpu(self) -> float:
        return self.tokens / max(1, self.num_gpus) / self.seconds


def make_engine(args: argparse.Namespace, spec: SpeculativeConfig | None) -> Engine:
    model = model_preset(args.model, **({"num_layers": args.num_layers} if args.num_layers else {}))
    max_conc = max(args.concurrency)
    return Engine(EngineConfig(
        model=model,
        cache=CacheConfig(block_size=model.default_block_size, kv_cache_dtype=args.kv_cache_dtype,
                          enable_prefix_caching=False, kv_cache_gb=args.kv_cache_gb),
        scheduler=SchedulerConfig(max_num_seqs=max_conc, max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_model_len=args.prompt_len + args.output_len + 1),
        device=args.device, attention_backend=args.backend, seed=0, speculative=spec,
    ))


def sync(engine: Engine) -> None:
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize(engine.runner.device)


def measure(engine: Engine, mode: str, concurrency: int, prompt_len: int, output_len: int, tag: str) -> Row:
    gen = torch.Generator().manual_seed(concurrency)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    for i in range(concurrency):
        ids = tuple(torch.randint(0, 256, (prompt_len,), generator=gen).tolist())
        engine.add_request(AddRequest(f"{tag}{i}", ids, params, 0.0))
    started: set[str] = set()
    while len(started) < concurrency:  # prefill (and each request's first token) is not timed
        started.update(o.request_id for o in engine.step().outputs)
    before = engine.stats()
    sync(engine)
    start = time.perf_counter()
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    seconds = time.perf_counter() - start
    after = engine.stats()
    drafts = after.spec_num_drafts - before.spec_num_drafts
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    al = (drafts + accepted) / drafts if drafts else 1.0
    tokens = after.generation_tokens - before.generation_tokens
    return Row(mode, concurrency, al, seconds / max(1, steps), tokens, seconds, engine.num_gpus)


def print_table(rows: list[Row]) -> None:
    base = {r.concurrency: r for r in rows if r.mode == "off"}
    head = (f"{'mode':18} {'conc':>4} {'AL':>5} {'step ms':>8} {'tok/s/req':>10} {'tok/s/GPU':>10} {'speed-up':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        ref = base.get(r.concurrency)
        gain = f"{r.per_gpu / ref.per_gpu:7.2f}x" if ref else "       -"
        print(f"{r.mode:18} {r.concurrency:4d} {r.measured_al:5.2f} {r.step_s * 1e3:8.2f} {r.per_request:10.1f} "
              f"{r.per_gpu:10.1f} {gain}")


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small", choices=("tiny", "small", "v32"))
    p.add_argument("--num-layers", type=int, default=None, help="override the preset's layer count")
    p.add_argument("--k", type=int, default=5, help="num_speculative_tokens (default: 5)")
    p.add_argument("--al", type=float, default=3.51, help="synthetic acceptance length (default: 3.51)")
    p.add_argument("--concurrency", default="1,8,32", help="comma list of concurrent requests")
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--kv-cache-dtype", default="bf16", choices=("bf16", "fp8"))
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--kv-cache-gb", type=float, default=0.25, help="KV pool on CPU only")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, short prompts (checks this script)")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.device, args.backend, args.num_layers = "tiny", "cpu", "torch", 1
        args.concurrency, args.prompt_len, args.output_len = "1,2", 32, 16
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency: expected a comma list of integers, got {args.concurrency!r}")
    if any(c < 1 for c in args.concurrency) or args.prompt_len < 1 or args.output_len < 2:
        p.error("--concurrency, --prompt-len must be >= 1 and --output-len >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = SpeculativeConfig("mtp", args.k, "synthetic", synthetic_acceptance_length=args.al)
    except ValueError as exc:
        print(f"spec_decode: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    for mode, config in (("off", None), (f"mtp k={args.k} AL={args.al:g}", spec)):
        progress(f"building {args.model} engine ({mode})")
        engine = make_engine(args, config)
        measure(engine, mode, 1, min(args.prompt_len, 64), 8, "warm")  # compile kernels, warm caches
        for c in args.concurrency:
            progress(f"{mode}: concurrency {c}")
            rows.append(measure(engine, mode, c, args.prompt_len, args.output_len, f"c{c}-"))
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"# {args.model}, prompt {args.prompt_len}, output {args.output_len}, synthetic acceptance "
          f"(decode phase only; tok/s/GPU counts every GPU the engine uses)")
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
