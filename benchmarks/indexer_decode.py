"""The indexer's default paths at issue 12's shapes, for before/after comparisons in one GPU call.

Times what kernels.indexer.indexer_logits_paged runs by default: decode steps (one query token per
request: 64 and 16 requests at 64k keys with 64 heads, 128 requests at 4k with 16 heads) and one
prefill chunk (2,048 tokens at the end of a 64k prompt), fp8 and MXFP4 keys; with --wide-scales also
MXFP4 keys whose group scales lie 2^20 apart (far past one e4m3 operand per key). Each is first checked
against the torch reference with poisoned outputs (decode: at full and staggered contexts), then
timed (do_bench median, inputs rotating) and reported as % of the copy bandwidth that
benchmarks/kernels.py uses. It uses only the public entry point, so the same file run against an
older checkout (PYTHONPATH and the file copied there) measures that checkout's defaults; --sweep
adds one-token tiled configs at every shape. With --verify K the decode shapes become speculative
verify steps: each request's K + 1 query tokens (its last token and K drafts, contexts ending one
apart), and --sweep adds tiles of K + 1 tokens, which read a request's keys once for all of them.

    PYTHONPATH=. python3 benchmarks/indexer_decode.py [--sweep] [--wide-scales] [--key-dtypes mxfp4] [--label NAME]
    PYTHONPATH=. python3 benchmarks/indexer_decode.py --verify 3 --sweep --no-prefill
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent))
from kernels_module import kernels_benchmark  # noqa: E402

kb = kernels_benchmark()  # the kernels benchmark's helpers (it puts the repository root on sys.path)

from kernels.indexer import indexer_logits_paged  # noqa: E402
from kernels.indexer_tiled import TiledConfig, indexer_logits_tiled  # noqa: E402
from kernels.quant import indexer_row_bytes  # noqa: E402

DECODE_SHAPES = ((64, 65536, 64), (16, 65536, 64), (128, 4096, 16))  # requests, context, index heads
PREFILL_CHUNK, PREFILL_CONTEXT = 2048, 65536


def sweep_configs(key_dtype: str) -> tuple[TiledConfig, ...]:
    """One-token tiled configs (MXFP4: group dots, grids of one and two waves and rounded up); made
    only with --sweep, so the file runs against checkouts whose TiledConfig lacks `prefetch`,
    `mx_scoring` or `one_wave`."""
    if key_dtype == "fp8":
        return (TiledConfig(1, 64, 4, 16, 1), TiledConfig(1, 64, 4, 16, 1, prefetch=True),
                TiledConfig(1, 64, 4, 8, 1, prefetch=True), TiledConfig(1, 128, 8, 8, 1, prefetch=True),
                TiledConfig(1, 128, 4, 8, 1), TiledConfig(1, 128, 4, 8, 1, prefetch=True),
                TiledConfig(1, 64, 4, 12, 1, prefetch=True), TiledConfig(1, 64, 4, 24, 1, prefetch=True),
                TiledConfig(1, 32, 4, 16, 1, prefetch=True), TiledConfig(1, 32, 2, 32, 1, prefetch=True),
                TiledConfig(1, 64, 2, 32, 1, prefetch=True))
    return (TiledConfig(1, 64, 4, 3, 1, mx_scoring="group_dots", prefetch=True, one_wave=True),
            TiledConfig(1, 64, 4, 6, 1, mx_scoring="group_dots", prefetch=True, one_wave=True),
            TiledConfig(1, 64, 4, 8, 1, mx_scoring="group_dots", prefetch=True),
            TiledConfig(1, 64, 4, 8, 1, mx_scoring="group_dots"),
            TiledConfig(1, 64, 4, 4, 1, mx_scoring="group_dots", prefetch=True),
            TiledConfig(1, 64, 4, 6, 1, mx_scoring="group_dots", prefetch=True),
            TiledConfig(1, 64, 4, 12, 1, mx_scoring="group_dots", prefetch=True),
            TiledConfig(1, 64, 4, 4, 1, mx_scoring="group_dots"))


def verify_configs(key_dtype: str, tokens: int) -> tuple[TiledConfig, ...]:
    """Tiles of a verify step's `tokens` query tokens (one request's), fp8 and MXFP4 scorings."""
    if key_dtype == "fp8":
        return tuple(TiledConfig(tokens, n, w, p, 1, prefetch=f) for n, w, p, f in
                     ((64, 4, 8, True), (64, 4, 8, False), (64, 8, 4, True), (128, 8, 4, True), (64, 8, 8, False),
                      (32, 4, 16, True)))
    return tuple(TiledConfig(tokens, n, w, p, 1, mx_scoring=m, prefetch=f) for n, w, p, m, f in
                 ((64, 4, 4, "rows", False), (64, 8, 4, "rows", False), (128, 8, 4, "rows", False),
                  (64, 4, 4, "group_dots", True), (64, 8, 4, "group_dots", True), (32, 4, 8, "rows", False)))


def report(label: str, case: str, verdict: str, ms: float, nbytes: float) -> None:
    gbps = nbytes / ms / 1e6
    print(f"{label:<8} {case:<34} {verdict:<18} {ms * 1e3:8.1f} us {gbps:6.0f} GB/s {100 * gbps / (kb.COPY_TBPS * 1e3):4.0f}% copy",
          flush=True)


def decode_case(label: str, key_dtype: str, requests: int, context: int, heads: int, sweep: bool,
                wide_scales: bool = False, verify: int = 0) -> None:
    """A decode step (verify = 0) or a verify step of `verify` drafts: requests x (verify + 1)
    query tokens, a request's tokens seeing context - verify, ..., context keys."""
    block_size = 64
    tokens = verify + 1
    cache = kb.make_indexer_cache(requests * context, key_dtype, block_size, wide_scales)
    table = torch.randperm(requests * context // block_size, device="cuda").int().reshape(requests, -1)
    seq_ids = torch.arange(requests, device="cuda", dtype=torch.int32).repeat_interleave(tokens)
    lens = (context - verify + torch.arange(tokens, device="cuda", dtype=torch.int32)).repeat(requests)
    sets = [kb.indexer_query(requests * tokens, heads) for _ in range(3)]
    nbytes = requests * context * (indexer_row_bytes(kb.D_I, key_dtype) + 4) + requests * tokens * heads * (kb.D_I + 4)
    launches = [("default", lambda q, w, n: indexer_logits_paged(q, w, cache, key_dtype, table, block_size, seq_ids,
                                                                  n, context))]
    if sweep and verify:
        for c in verify_configs(key_dtype, tokens):
            scoring = f" {c.mx_scoring}" if key_dtype == "mxfp4" else ""
            launches.append((f"m{c.block_m} n{c.block_n} w{c.num_warps} p{c.programs_per_sm}{scoring}"
                             f"{' prefetch' if c.prefetch else ''}",
                             lambda q, w, n, c=c: indexer_logits_tiled(q, w, cache, key_dtype, table, seq_ids, n,
                                                                       block_size, context, c)))
    elif sweep:
        for c in sweep_configs(key_dtype):
            prefetch = " prefetch" if c.prefetch else ""
            scoring = f" {c.mx_scoring}" if key_dtype == "mxfp4" else ""
            wave = " one wave" if c.one_wave else ""
            launches.append((f"n{c.block_n} w{c.num_warps} p{c.programs_per_sm} s{c.num_stages}{scoring}{prefetch}{wave}",
                             lambda q, w, n, c=c: indexer_logits_tiled(q, w, cache, key_dtype, table, seq_ids, n,
                                                                       block_size, context, c)))
    if wide_scales:  # the previous default, which has no fallback to take
        old = TiledConfig(1, 64, 4, 8, 1, mx_scoring="group_dots", prefetch=True)
        launches.append(("n64 group_dots prefetch", lambda q, w, n: indexer_logits_tiled(
            q, w, cache, key_dtype, table, seq_ids, n, block_size, context, old)))
    for name, launch in launches:
        q, w = sets[0]
        verdict = kb.check_decode_indexer(launch, q, w, cache, key_dtype, table, block_size, seq_ids, lens, context)
        ms = kb.bench([lambda q=q, w=w, launch=launch: launch(q, w, lens) for q, w in sets])
        wide = " wide scales" if wide_scales else ""
        step = f"verify{verify}" if verify else "decode"
        report(label, f"{step} {key_dtype}{wide} {requests}x{context} H{heads} {name}", verdict, ms, nbytes)


def prefill_case(label: str, key_dtype: str) -> None:
    cache, table, bs, seq_ids, lens, sets = kb.prefill_indexer_case(key_dtype, PREFILL_CHUNK, PREFILL_CONTEXT)
    q, w = sets[0]
    with kb.poisoned_outputs():
        got = indexer_logits_paged(q, w, cache, key_dtype, table, bs, seq_ids, lens, PREFILL_CONTEXT)
    ref = indexer_logits_paged(q, w, cache, key_dtype, table, bs, seq_ids, lens, PREFILL_CONTEXT, backend="torch")
    ok, diff = kb.logits_match(got, ref)
    ms = kb.bench([lambda q=q, w=w: indexer_logits_paged(q, w, cache, key_dtype, table, bs, seq_ids, lens,
                                                          PREFILL_CONTEXT) for q, w in sets])
    nbytes = PREFILL_CONTEXT * indexer_row_bytes(kb.D_I, key_dtype) + 4.0 * float(lens.sum())
    report(label, f"prefill {key_dtype} {PREFILL_CHUNK} tok at {PREFILL_CONTEXT}",
           f"{'ok' if ok else 'FAIL'} (diff {diff:.1e})", ms, nbytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="also time one-token tiled configs at 64 x 64k and 128 x 4k")
    parser.add_argument("--verify", type=int, default=0, metavar="K",
                        help="decode shapes as verify steps of K drafts (K + 1 query tokens a request)")
    parser.add_argument("--label", default="this", help="first column of every line (which checkout)")
    parser.add_argument("--no-prefill", action="store_true", help="skip the prefill chunk")
    parser.add_argument("--key-dtypes", default="fp8,mxfp4", help="comma list of key formats to time")
    parser.add_argument("--wide-scales", action="store_true",
                        help="also MXFP4 decode at the 64k shapes with every key's group scales 2^20 apart")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/indexer_decode.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    for key_dtype in args.key_dtypes.split(","):
        for requests, context, heads in DECODE_SHAPES:
            decode_case(args.label, key_dtype, requests, context, heads, args.sweep, verify=args.verify)
        if key_dtype == "mxfp4" and args.wide_scales:
            for requests, context, heads in DECODE_SHAPES[:2]:
                decode_case(args.label, key_dtype, requests, context, heads, False, wide_scales=True)
        if not args.no_prefill:
            prefill_case(args.label, key_dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
