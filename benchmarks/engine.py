"""Engine benchmark (H200, not run by CI): decode step time and prefill throughput against the roofline.

For each model preset, kernel backend and KV dtype it measures
- decode: the wall time of one `Engine.step()` with B requests each holding `--context` tokens
  (B in --batches), steps run back to back as a server runs them (median), with overlapped
  scheduling on and/or off (--overlap); "host work" is the step's time minus the time it waited
  for the sampled tokens' copy, i.e. the host's own work per step, hidden when it overlaps. The requests are placed in the cache directly (blocks allocated, rows filled
  with valid random values) instead of being prefilled, so large batches are quick to set up;
  every decode step still runs the full model, indexer, top-k and sparse attention.
  With `--speculative K` each step is a speculative one instead: every request verifies its K
  drafts (K + 1 query tokens) and the draft head proposes the next ones; acceptance is synthetic at
  `--acceptance-length`, and tok/s counts the tokens the steps emitted.
- prefill: prompt tokens/s for `--prefill-requests` prompts of `--prefill-len` tokens, chunked
  under --max-num-batched-tokens, prefix caching off.

Roofline per decode step: max(bytes / 4.04 TB/s, FLOPs / 738 TFLOP/s), where bytes = every
weight except the embedding table (read once per step) + per request and layer the indexer
keys of the whole context and the K selected latent rows; FLOPs = 2 x those weights x B + the
indexer's and sparse attention's products. Prefill roofline: FLOPs per token at the mean context.

    PYTHONPATH=. python benchmarks/engine.py --model small --backends triton,torch
    PYTHONPATH=. python benchmarks/engine.py --model v32 --num-layers 4 --batches 1,8,32,128
    PYTHONPATH=. python benchmarks/engine.py --smoke        # tiny model on CPU: tests this script
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kernels.quant import indexer_row_bytes, kv_row_bytes, write_indexer_cache, write_kv_cache  # noqa: E402
from server.config import (  # noqa: E402
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    model_preset,
)
from server.engine.core import Engine  # noqa: E402
from server.engine.cuda_graph import context_buckets  # noqa: E402
from server.engine.kv_cache import kernel_kv_dtype  # noqa: E402
from server.engine.messages import AddRequest, SamplingParams  # noqa: E402
from server.engine.pending import LaunchedStep  # noqa: E402
from server.engine.sequence import SequenceStatus  # noqa: E402
from server.engine.warmup import compiles_unwatched  # noqa: E402

HBM_TBPS = 4.04  # H200 device copy measured for this project
MATMUL_TFLOPS = 738.0  # H200 bf16 matrix product measured for this project


@dataclass(frozen=True)
class Row:
    model: str
    backend: str
    mode: str  # "graph" (CUDA-graph decode) or "eager"
    overlap: bool  # overlapped scheduling
    kv: str
    phase: str
    batch: int
    context: int
    seconds: float  # per decode step, or for the whole prefill
    tokens: float  # tokens emitted per decode step (mean), or prompt tokens (prefill) in `seconds`
    roofline_s: float
    device_s: float | None = None  # graph mode: one replay of the step's graph alone (device time)
    host_work_s: float | None = None  # decode: step time minus the wait for the sampled tokens


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("embed."))


def attention_cost(m: ModelConfig, kv: str, key: str, context: int) -> tuple[int, int]:
    """(bytes, FLOPs) of one query token's indexer + sparse attention over `context` tokens, all layers."""
    k = min(m.index_topk, context)
    nbytes = context * indexer_row_bytes(m.index_head_dim, key) + k * kv_row_bytes(m.kv_lora_rank, m.qk_rope_dim, kv)
    flops = 2 * m.index_num_heads * m.index_head_dim * context + 2 * m.num_heads * k * (m.kv_row_dim + m.kv_lora_rank)
    return nbytes * m.num_layers, flops * m.num_layers


def roofline(nbytes: float, flops: float) -> float:
    return max(nbytes / (HBM_TBPS * 1e12), flops / (MATMUL_TFLOPS * 1e12))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def place_prefilled(engine: Engine, batch: int, context: int, max_tokens: int) -> None:
    """Admit `batch` requests whose first `context` tokens are already in the cache."""
    runner, m = engine.runner, engine.config.model
    gen = torch.Generator().manual_seed(0)
    for i in range(batch):
        ids = torch.randint(0, 256, (context,), generator=gen).tolist()
        engine.add_request(AddRequest(f"d{i}", tuple(ids), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                          ignore_eos=True), 0.0))
    sched, blocks = engine.scheduler, engine.blocks
    while sched.waiting:
        seq = sched.waiting.popleft()
        blocks.append(seq, context)
        bs = blocks.block_size
        slots = torch.tensor([b * bs + o for b in seq.block_ids for o in range(bs)][:context - 1], device=runner.device)
        with compiles_unwatched():  # the benchmark's fill, not a step: its quantiser's compile is no stall
            for kv, idx in zip(runner.cache.kv, runner.cache.indexer):
                for chunk in slots.split(65536):
                    n = chunk.numel()
                    write_kv_cache(kv, chunk, torch.randn(n, m.kv_lora_rank, device=runner.device),
                                   torch.randn(n, m.qk_rope_dim, device=runner.device), runner.settings.kv_dtype)
                    write_indexer_cache(idx, chunk, torch.randn(n, m.index_head_dim, device=runner.device),
                                        runner.settings.key_dtype)
        # The last prompt token is left to compute, as after a normal prefill's final chunk.
        seq.num_computed_tokens = context - 1
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)


def make_engine(args: argparse.Namespace, backend: str, kv: str, num_blocks: int, max_len: int,
                max_seqs: int, budget: int, mode: str = "eager", graph_sizes: tuple[int, ...] = (),
                speculative: SpeculativeConfig | None = None, overlap: bool = True) -> Engine:
    overrides = {"num_layers": args.num_layers} if args.num_layers else {}
    model = model_preset(args.model, **overrides)
    return Engine(EngineConfig(
        model=model,
        cache=CacheConfig(block_size=args.block_size or model.default_block_size, kv_cache_dtype=kv,
                          indexer_key_dtype=args.indexer_key_dtype, enable_prefix_caching=False,
                          num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_len),
        device=args.device, attention_backend=backend, seed=0, enforce_eager=mode == "eager",
        cuda_graph_sizes=graph_sizes, speculative=speculative,
        overlap_schedule="on" if overlap else "off",
    ))


@contextlib.contextmanager
def timed_token_waits() -> Iterator[list[float]]:
    """Seconds each step waits for its sampled tokens' host copy (LaunchedStep.tokens), appended."""
    waits: list[float] = []
    tokens = LaunchedStep.tokens

    def timed(self: LaunchedStep) -> list[int]:
        start = time.perf_counter()
        out = tokens(self)
        waits.append(time.perf_counter() - start)
        return out

    LaunchedStep.tokens = timed  # type: ignore[method-assign]
    try:
        yield waits
    finally:
        LaunchedStep.tokens = tokens  # type: ignore[method-assign]


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """--speculative K: MTP drafts verified with synthetic acceptance at --acceptance-length."""
    if not args.speculative:
        return None
    return SpeculativeConfig(method="mtp", num_speculative_tokens=args.speculative, rejection_sample_method="synthetic",
                             synthetic_acceptance_length=args.acceptance_length)


def decode_engine(args: argparse.Namespace, backend: str, kv: str, batch: int, mode: str, steps: int,
                  overlap: bool = True) -> Engine:
    """An engine holding `batch` requests prefilled to --context tokens, with room (blocks and
    length) for `steps` decode steps and two more (for --count-kernels), and a graph of `batch`;
    with --speculative K each of those steps may emit K + 1 tokens."""
    bs = args.block_size or model_preset(args.model).default_block_size
    tokens = (steps + 2) * (args.speculative + 1)
    max_len = args.context + tokens
    num_blocks = batch * -(-max_len // bs) + 1
    engine = make_engine(args, backend, kv, num_blocks, max_len, max(batch, 1),
                         max(batch * (args.speculative + 1), args.max_num_batched_tokens), mode, graph_sizes=(batch,),
                         speculative=speculative_config(args), overlap=overlap)
    place_prefilled(engine, batch, args.context, tokens)
    return engine


def bench_decode(args: argparse.Namespace, backend: str, kv: str, batch: int, mode: str, overlap: bool) -> Row:
    steps = args.warmup + args.steps
    engine = decode_engine(args, backend, kv, batch, mode, steps, overlap)
    times, host = [], []
    sync(engine.runner.device)
    with timed_token_waits() as waits:
        for i in range(steps):
            if i == args.warmup:
                emitted = engine.stats().generation_tokens
            waited = len(waits)
            start = time.perf_counter()
            engine.step()  # ends in one step's sampled tokens' host copy (with overlap: the previous step's)
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
                host.append(times[-1] - sum(waits[waited:]))
    per_step = (engine.stats().generation_tokens - emitted) / args.steps  # batch, or more with drafts accepted
    if mode == "graph" and engine.runner.graphs is None:
        raise RuntimeError("--modes graph: the engine captured no CUDA graphs (CPU, torch backend or --tp > 1)")
    device_s = replay_seconds(engine) if mode == "graph" else None
    if args.count_kernels and mode == "eager" and engine.runner.device.type == "cuda":
        print(f"{args.model} {kv} B={batch}: {count_kernels(engine)} GPU kernels per eager decode step", flush=True)
    m = engine.config.model
    att_bytes, att_flops = attention_cost(m, kernel_kv_dtype(engine.config.cache), args.indexer_key_dtype, args.context)
    w = weight_bytes(engine.runner.model)
    w_params = w / engine.runner.model.lm_head.weight.element_size()
    q = args.speculative + 1  # query tokens per request; a request's keys are read once
    limit = roofline(w + batch * att_bytes, 2 * w_params * batch * q + batch * q * att_flops)
    phase = f"verify{args.speculative}" if args.speculative else "decode"
    return Row(args.model, backend, mode, overlap, kv, phase, batch, args.context, statistics.median(times),
               per_step, limit, device_s, statistics.median(host))


def replay_seconds(engine: Engine, reps: int = 20) -> float:
    """Device time of the decode graph the engine's last step replayed, alone: back-to-back replays
    timed with CUDA events (that graph's inputs are still in place; the inputs are laid out per
    graph, so another graph would read stale ones). The step's wall time minus this is the host
    time the step does not hide."""
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.last_key is not None, "replay_seconds: no graph was replayed"
    graph = graphs.graphs[graphs.last_key]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps / 1e3


def bench_prefill(args: argparse.Namespace, backend: str, kv: str) -> Row:
    bs = args.block_size or model_preset(args.model).default_block_size
    n, length = args.prefill_requests, args.prefill_len
    num_blocks = n * -(-(length + 1) // bs) + 1
    engine = make_engine(args, backend, kv, num_blocks, length + 1, n, args.max_num_batched_tokens)
    gen = torch.Generator().manual_seed(1)

    def run(tag: str) -> float:
        for i in range(n):
            ids = tuple(torch.randint(0, 256, (length,), generator=gen).tolist())
            engine.add_request(AddRequest(f"{tag}{i}", ids, SamplingParams(max_tokens=1, temperature=0.0), 0.0))
        sync(engine.runner.device)
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return time.perf_counter() - start

    run("warm")
    seconds = run("p")
    if args.count_kernels:
        print(f"prefill of {n} x {length} tokens:")
        count_kernels(engine, lambda: run("k"))
    m = engine.config.model
    _, att_flops = attention_cost(m, kernel_kv_dtype(engine.config.cache), args.indexer_key_dtype, length // 2)
    w_params = weight_bytes(engine.runner.model) / engine.runner.model.lm_head.weight.element_size()
    limit = n * length * roofline(0.0, 2 * w_params + att_flops)
    return Row(args.model, backend, "eager", True, kv, "prefill", n, length, seconds, n * length, limit)


def count_kernels(engine: Engine, work: Callable[[], object] | None = None) -> int:
    """GPU kernels that `work` (default: one decode step, what a graph replays node by node) launches,
    with the kernels that take the most time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        (work or engine.step)()
        sync(engine.runner.device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:70], []).append(e.time_range.elapsed_us())
    total = sum(map(sum, by_name.values()))
    print(f"  kernel time {total / 1e3:.3f} ms in {len(kernels)} kernels; top by time (us total, count):")
    for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:18]:
        print(f"    {sum(times):9.1f} {len(times):4d}  {name}")
    return len(kernels)


def check_requests(max_prompt: int | None = None) -> list[tuple[tuple[int, ...], int]]:
    """(prompt, output tokens) of the checks' requests: ragged (batches shrink as requests finish),
    one prompt past the shortest context bucket, where the top-k leaves its one-launch kernel
    (prompts cut to max_prompt tokens when given: the CPU smoke runs)."""
    short = context_buckets(1 << 20)[0]  # the shortest context bucket
    lengths, outputs = (1, 17, 200, 1000, 3000, 70, 513, short + 100), (8, 12, 16, 20, 24, 30, 5, 4)
    gen = torch.Generator().manual_seed(2)
    prompts = [tuple(torch.randint(0, 256, (n,), generator=gen).tolist())[:max_prompt] for n in lengths]
    return list(zip(prompts, outputs))


def check_engine(args: argparse.Namespace, backend: str, kv: str, mode: str,
                 speculative: SpeculativeConfig | None = None, overlap: bool = False,
                 max_prompt: int | None = None) -> Engine:
    """An engine for check_requests(max_prompt): 8 sequences, 4,096 tokens a step, room for every
    request's blocks four times over, a context twice the shortest bucket (or the model's)."""
    requests = check_requests(max_prompt)
    bs = args.block_size or model_preset(args.model).default_block_size
    blocks = sum(-(-(len(p) + m) // bs) + 1 for p, m in requests) + 8
    max_len = min(2 * context_buckets(1 << 20)[0], model_preset(args.model).max_position)
    return make_engine(args, backend, kv, blocks * 4, max_len, 8, 4096, mode, speculative=speculative,
                       overlap=overlap)


def add_check_requests(engine: Engine, max_prompt: int | None = None,
                       sampling: dict[int, dict] | None = None) -> None:
    """Queue check_requests(max_prompt) as r0, r1, ...: greedy, each to its full output length, but
    for the sampling parameters `sampling` gives request i."""
    for i, (prompt, outputs) in enumerate(check_requests(max_prompt)):
        params = {"max_tokens": outputs, "temperature": 0.0, "ignore_eos": True, **(sampling or {}).get(i, {})}
        engine.add_request(AddRequest(f"r{i}", prompt, SamplingParams(**params), 0.0))


def check_graph_tokens(args: argparse.Namespace) -> None:
    """Tokens of a graph engine against an eager one over ragged requests (greedy but for one
    seeded sampled request and one with min_tokens; batches shrink as requests finish, so several
    buckets and their padding run; one request's context passes the short context bucket, and it
    finishes first, so both context buckets run), without and with speculative
    decoding (3 drafts verified by standard verification, one step at a time, and with synthetic
    acceptance, whose steps overlap too: the verify steps replay their own graphs);
    prints the verdicts, the graph replays per (batch, query tokens, context bucket), and the largest logit
    difference of a graph replay against the same padded step run eagerly."""
    num_requests = len(check_requests())
    # r1 samples at a temperature (seeded: the same draws in every engine) and r5 holds EOS back
    # for its first tokens, so steps mix the decode graph's greedy tokens with the sampler's own.
    sampling: dict[int, dict] = {1: {"temperature": 0.8, "top_p": 0.9, "seed": 11}, 5: {"min_tokens": 3}}
    synthetic = SpeculativeConfig(method="mtp", num_speculative_tokens=3, rejection_sample_method="synthetic",
                                  synthetic_acceptance_length=2.5)
    for spec in (None, SpeculativeConfig(method="mtp", num_speculative_tokens=3), synthetic):
        results, replays = {}, Counter()
        # Reference: eager, one step at a time (standard verification does not overlap).
        # "eager again" repeats the reference: two runs of one tree on one schedule must agree.
        variants = [("eager", False), ("eager again", False), ("graph", False)] + (
            [("eager", True), ("graph", True)] if spec is None or spec.synthetic else [])
        margins: dict[tuple[str, bool], dict[str, list[float]]] = {}
        for mode, overlap in variants:
            engine = check_engine(args, "triton", args.kv_dtypes.split(",")[0], mode.split()[0], spec, overlap)
            if spec is None:
                margins[mode, overlap] = record_margins(engine)
            graphs = engine.runner.graphs
            if graphs is not None:
                replay = graphs.replay

                def counted(*a, _replay=replay, _graphs=graphs, _replays=replays):
                    out = _replay(*a)
                    _replays[_graphs.last_key] += 1
                    return out

                graphs.replay = counted
            add_check_requests(engine, sampling=sampling)
            tokens: dict[str, list[int]] = {}
            while engine.has_unfinished():
                for out in engine.step().outputs:
                    tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            results[mode, overlap] = tokens
            if mode == "graph" and spec is None and not overlap:
                # the last replay's graph: its inputs (laid out per graph) are still in place
                key = graphs.last_key
                assert key is not None
                with torch.inference_mode():
                    eager_a = graphs._forward(*key)[0].clone()
                    eager_b = graphs._forward(*key)[0].clone()
                    graphs.graphs[key].replay()
                    replayed = graphs.outputs[key][0].clone()
                print(f"graph check: batch {key[0]} replay vs the same step eager: max |dlogit| "
                      f"{float((replayed - eager_a).abs().max()):.3e} (eager twice: {float((eager_b - eager_a).abs().max()):.3e}); "
                      f"capture of {len(graphs.graphs)} graphs took {graphs.capture_seconds:.2f} s", flush=True)
        label = "decode" if spec is None else f"speculative (k=3, {spec.rejection_sample_method})"
        again = results.pop(("eager again", False))
        same = [r for r in again if again[r] != results["eager", False].get(r)]
        print(f"graph check {label}: eager twice, overlap off: {'DIFFER in ' + ','.join(same) if same else 'IDENTICAL'}",
              flush=True)
        for (mode, overlap), got in results.items():
            if mode == "eager":
                continue
            # Against the eager engine on the same schedule: overlapped scheduling plans each step
            # before the previous step's tokens are read, so its steps may batch requests
            # differently, and a projection's numerics follow its row count (batch-1 GEMVs,
            # cuBLAS's kernel by rows): a random model's greedy tokens may flip at near-ties
            # between the two schedules, which says nothing about the graphs.
            ref = results["eager", overlap]
            diverged = [r for r in ref if ref[r] != got.get(r)]
            print(f"graph check {label}: tokens graph overlap {'on' if overlap else 'off'} vs eager on the same schedule: "
                  f"{'DIFFER in ' + ','.join(diverged) if diverged else 'IDENTICAL'} "
                  f"({sum(map(len, got.values()))} tokens, {num_requests} requests)", flush=True)
            for r in diverged if spec is None else ():
                at = next(i for i, (a, b) in enumerate(zip(ref[r], got[r])) if a != b)
                print(f"  {r}: first differs at token {at}; top-2 logit margin there: eager "
                      f"{margins['eager', overlap][r][at]:.3e}, graph {margins[mode, overlap][r][at]:.3e}", flush=True)
        print(f"graph check {label}: replays by (batch, query tokens, context bucket): {dict(sorted(replays.items()))}", flush=True)


def record_margins(engine: Engine) -> dict[str, list[float]]:
    """Each request's top-2 logit margin at every token it samples (the gap a numerics change must
    cross to flip a greedy token), filled in as the engine runs: a host sync per step, for checks."""
    margins: dict[str, list[float]] = {}
    execute = engine.runner.execute

    def recorded(batch, num_logits, *rest):
        logits = execute(batch, num_logits, *rest)
        top2 = logits.topk(2, dim=-1).values
        gaps = (top2[:, 0] - top2[:, 1]).tolist()
        wanting = [s.request_id for s, k in zip(batch.seqs, num_logits) for _ in range(k)]
        for request_id, gap in zip(wanting, gaps):
            margins.setdefault(request_id, []).append(gap)
        return logits

    engine.runner.execute = recorded
    return margins


def print_table(rows: list[Row]) -> None:
    head = (f"{'model':6} {'backend':7} {'kv':5} {'phase':8} {'batch':>5} {'ctx':>6} {'time ms':>10} {'tok/s':>11} "
            f"{'roof ms':>9} {'% roof':>7} {'mode':5} {'overlap':7} {'host work':>9} {'graph ms':>8} {'host ms':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.model:6} {r.backend:7} {r.kv:5} {r.phase:8} {r.batch:5d} {r.context:6d} {r.seconds * 1e3:10.3f} "
              f"{r.tokens / r.seconds:11.1f} {r.roofline_s * 1e3:9.3f} {100 * r.roofline_s / r.seconds:6.1f}% {r.mode:5} "
              f"{'on' if r.overlap else 'off':7}"
              + (f" {r.host_work_s * 1e3:9.3f}" if r.host_work_s is not None else "")
              + (f" {r.device_s * 1e3:8.3f} {(r.seconds - r.device_s) * 1e3:7.3f}" if r.device_s is not None else ""))


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The flags make_engine reads besides the backend and KV dtype: the model, its cache's
    indexer key dtype and block size, and the device (benchmarks/determinism.py takes them too)."""
    p.add_argument("--model", default="small", choices=("tiny", "small", "v32"))
    p.add_argument("--num-layers", type=int, default=None, help="override the preset's layer count")
    p.add_argument("--indexer-key-dtype", default="fp8", choices=("fp8", "mxfp4"))
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--backends", default="triton,torch", help="comma list of kernel backends")
    p.add_argument("--kv-dtypes", default="bf16,fp8", help="comma list of --kv-cache-dtype values")
    p.add_argument("--modes", default="graph,eager",
                   help="comma list of decode modes: graph (CUDA-graph replay) and/or eager (--enforce-eager); "
                        "graph needs CUDA and the triton backend")
    p.add_argument("--overlap", default="on", help="comma list: decode with overlapped scheduling on and/or off")
    p.add_argument("--no-prefill", action="store_true", help="decode steps only")
    p.add_argument("--count-kernels", action="store_true",
                   help="print the GPU kernels of one eager decode step, and of one more prefill run")
    p.add_argument("--check-graphs", action="store_true",
                   help="first check on the GPU that graph and eager engines emit the same tokens (greedy, "
                        "one seeded sampled request, one with min_tokens), and two eager runs the same; a "
                        "flip prints its top-2 logit margin")
    p.add_argument("--batches", default="1,8,32,128", help="decode batch sizes (empty: no decode)")
    p.add_argument("--context", type=int, default=4096, help="tokens per request during decode")
    p.add_argument("--steps", type=int, default=20, help="measured decode steps")
    p.add_argument("--speculative", type=int, default=0, metavar="K",
                   help="decode steps verify K drafts per request (MTP, synthetic acceptance, overlapped as "
                        "--overlap says); 0: plain decode")
    p.add_argument("--acceptance-length", type=float, default=2.5,
                   help="with --speculative: the synthetic mean acceptance length")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prefill-requests", type=int, default=4)
    p.add_argument("--prefill-len", type=int, default=4096)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--smoke", action="store_true",
                   help="tiny model on CPU with the torch backend and small sizes (checks this script)")
    args = p.parse_args(argv)
    if not set(args.overlap.split(",")) <= {"on", "off"}:
        p.error(f"--overlap: a comma list of on and off, got {args.overlap!r}")
    if args.speculative < 0:
        p.error(f"--speculative: a number of drafts >= 0, got {args.speculative}")
    if args.smoke:
        args.model, args.device, args.backends, args.batches, args.modes = "tiny", "cpu", "torch", "1,8", "eager"
        # two warm-up steps: with overlap a step reports the step before's tokens, the first step's
        # (the placed prompts' last token, one a request) at the second
        args.context, args.steps, args.warmup = 256, 3, 2
        args.prefill_requests, args.prefill_len, args.max_num_batched_tokens = 2, 512, 512
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    if args.check_graphs:
        check_graph_tokens(args)
    modes = args.modes.split(",")
    for backend in args.backends.split(","):
        for kv in args.kv_dtypes.split(","):
            for batch in (int(b) for b in args.batches.split(",") if b):
                for mode, overlap in itertools.product(modes, args.overlap.split(",")):
                    if mode == "graph" and backend != "triton":
                        continue
                    rows.append(bench_decode(args, backend, kv, batch, mode, overlap == "on"))
                    progress(f"done decode {backend} {mode} overlap {overlap} {kv} B={batch}")
            if not args.no_prefill:
                rows.append(bench_prefill(args, backend, kv))
                progress(f"done prefill {backend} {kv}")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    print(f"# engine benchmark: {args.model} ({args.num_layers or model_preset(args.model).num_layers} layers) "
          f"on {device}, torch {torch.__version__}, roofline {HBM_TBPS} TB/s / {MATMUL_TFLOPS} TFLOP/s")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
