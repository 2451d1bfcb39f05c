"""How long PromptSynth takes to build a long prompt, so replay never stalls its event loop.

Cases, each timed `--repeats` times (microseconds: median, p90, min):
- cold: a fresh PromptSynth builds a `--tokens` prompt (every block generated);
- warm, same: the same request again (every block copied from the cache);
- warm, extend: the next request of the session, `--new-blocks` more blocks than the cached one
  (the common case in an agentic session: the context grows by one turn);
- session: every request of the longest bundled session in order (per request, and ns/token);
- orjson: serialising the prompt for an HTTP body (OPT_SERIALIZE_NUMPY), for scale.

    python benchmarks/synth_speed.py [--tokens 150000] [--repeats 200] [--json]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traces import PromptSynth, Request, load_traces  # noqa: E402

BLOCK = 64


def _request(index: int, tokens: int, blocks: int) -> Request:
    return Request(index=index, t=0.0, input_tokens=tokens, output_tokens=1, hash_ids=tuple(range(blocks)),
                   think_time=0.0)


def _summary(samples_s: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples_s)
    return {"median_us": statistics.median(us), "p90_us": us[int(0.9 * (len(us) - 1))], "min_us": us[0]}


def _time(fn, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def measure(tokens: int, repeats: int, new_blocks: int) -> dict[str, dict[str, float]]:
    blocks = tokens // BLOCK
    full = _request(1, tokens, blocks)
    shorter = _request(0, tokens - new_blocks * BLOCK, blocks - new_blocks)
    results = {"cold": _summary(_time(lambda: PromptSynth(BLOCK).prompt("s", full, 1), repeats))}

    warm = PromptSynth(BLOCK)
    warm.prompt("s", full, 1)
    results["warm, same"] = _summary(_time(lambda: warm.prompt("s", full, 1), repeats))

    def extend() -> None:
        warm.prompt("s", shorter, 1)  # untimed: puts the shorter prompt in the cache
        start = time.perf_counter()
        warm.prompt("s", full, 1)
        extend_samples.append(time.perf_counter() - start)

    extend_samples: list[float] = []
    for _ in range(repeats):
        extend()
    results[f"warm, extend +{new_blocks} blocks"] = _summary(extend_samples)

    session = max(load_traces("agentic-coding").sessions, key=lambda s: sum(r.input_tokens for r in s.requests))
    synth = PromptSynth(session.block_size)
    per_request = _time_session(synth, session)
    results[f"session {session.id} ({len(session.requests)} req)"] = _summary(per_request)
    total_tokens = sum(r.input_tokens for r in session.requests)
    results[f"session {session.id} ({len(session.requests)} req)"]["ns_per_token"] = (
        sum(per_request) * 1e9 / total_tokens
    )

    prompt = PromptSynth(BLOCK).prompt("s", full, 1)
    results["orjson dumps prompt"] = _summary(
        _time(lambda: orjson.dumps({"prompt": prompt}, option=orjson.OPT_SERIALIZE_NUMPY), repeats)
    )
    return results


def _time_session(synth: PromptSynth, session) -> list[float]:
    samples = []
    for request in session.requests:
        start = time.perf_counter()
        synth.prompt(session.id, request, 7)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=150_000, help="prompt length (default 150000)")
    parser.add_argument("--repeats", type=int, default=200, help="timed runs per case (default 200)")
    parser.add_argument("--new-blocks", type=int, default=16, help="blocks added by the extend case (default 16)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    if args.tokens < BLOCK * (args.new_blocks + 1) or args.repeats < 1:
        parser.error(f"--tokens must be >= {BLOCK * (args.new_blocks + 1)} and --repeats >= 1")
    results = measure(args.tokens, args.repeats, args.new_blocks)
    host = {"python": platform.python_version(), "numpy": np.__version__,
            "cpu": platform.processor() or platform.machine()}
    if args.json:
        print(orjson.dumps({"tokens": args.tokens, "repeats": args.repeats, "host": host, "results": results},
                           option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"PromptSynth, {args.tokens:,}-token prompt, {args.repeats} runs; {host}")
    print(f"{'case':<36}{'median us':>11}{'p90 us':>11}{'min us':>11}")
    for case, row in results.items():
        extra = f"   ({row['ns_per_token']:.2f} ns/token)" if "ns_per_token" in row else ""
        print(f"{case:<36}{row['median_us']:>11,.0f}{row['p90_us']:>11,.0f}{row['min_us']:>11,.0f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
