"""Prototype (issue 12): indexer decode reading a split key cache through tensor descriptors.

Today's indexer key cache keeps a token's key as one row (fp8: 128 value bytes + a 4-byte fp32
scale; MXFP4: 64 bytes of nibbles + four ue8m0 group scales), rows only 4-byte aligned, so the
decode kernel (kernels/indexer_tiled.py) issues one 32-bit load with its own 64-bit address per
word and carries a prefetched block in registers. This prototype stores the same bytes as two
regions, values [num_slots, d_I] (fp8 bytes) or [num_slots, d_I / 8] (MXFP4 nibble words) and
scales [num_slots] (one 32-bit word per token), and loads each key block's values as one 2-D block
through a tensor descriptor: on Hopper a bulk asynchronous copy (TMA) into shared memory, with
`num_stages` blocks in flight per program and no per-word addresses or registers; where a target has
no such copy (NVIDIA before sm_90, AMD without TDM) Triton rewrites the descriptor loads to plain
pointer loads (RewriteTensorDescriptorToPointer), and the interpreter runs them as well.

The scoring is today's: fp8 keys' bytes are the e4m3 operand of one dot; MXFP4 keys take one dot per
32-value group on e4m3 bytes decoded from the nibble words, each group's scale on its result
(kernels/indexer_tiled.py's group dots), or with TmaConfig.dot_scaled one tl.dot_scaled on the nibbles
and group scales as they lie (emulated through bf16 on Hopper). A key block is BLOCK_N consecutive columns inside one cache
block (BLOCK_N divides the cache block size), so its rows are contiguous in both regions.

On a CUDA GPU it checks every variant against the torch reference (poisoned outputs, full and
staggered contexts), then times it against today's default (`indexer_logits_paged` on today's rows)
in the same process, with the copy bandwidth measured there too:

    PYTHONPATH=. python3 benchmarks/indexer_tma_proto.py [--key-dtypes fp8,mxfp4] [--requests 64,16] [--configs LABELS]

Measured on an H200 (benchmarks/RESULTS.md, "Indexer decode through tensor descriptors (TMA) on a
split key cache"): fp8 64 x 64k 209 -> 153 us (n64 w4 p16 s5), MXFP4 308 -> 294 us (p8 s5, group
dots; dot_scaled 520+ us).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# run as a script, benchmarks/ comes first on the path and its kernels.py would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.indexer_tiled import _mxfp4_group_dots, _query_groups  # noqa: E402
from kernels.quant import indexer_row_bytes  # noqa: E402
from kernels.triton_utils import new_output, row_programs  # noqa: E402


@triton.jit
def _mxfp4_block_scores(values_desc, scales, row0, q0, q1, q2, q3, D: tl.constexpr):
    """Scores [BLOCK_N, BLOCK_H] of the MXFP4 keys in rows row0.. : each 32-value group's four nibble
    words as its own [BLOCK_N, 4] block (16 bytes a row, the smallest a bulk copy takes)."""
    w0 = values_desc.load([row0, 0])
    w1 = values_desc.load([row0, 32 % D // 8])
    w2 = values_desc.load([row0, 64 % D // 8])
    w3 = values_desc.load([row0, 96 % D // 8])
    return _mxfp4_group_dots(scales, w0, w1, w2, w3, q0, q1, q2, q3, D, True, tl.float16)


@triton.jit(do_not_specialize=["block_size"])
def _indexer_decode_tma_kernel(
    q_ptr, w_ptr, values_desc, scales_ptr, scales_desc, out_ptr,
    block_table_ptr, seq_ids_ptr, end_ptr,
    n_cols, block_table_stride, block_size,
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    MXFP4: tl.constexpr, SCALES_TMA: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_SCALED: tl.constexpr,
):
    """Grid (tokens, programs per token): program p scores its token's key blocks p, p + P, ..."""
    tok = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    if MXFP4 and not DOT_SCALED:
        q0, q1, q2, q3 = _query_groups(q_ptr, tok + 0 * heads, heads, head_ok, H, D, True, tl.float16)
    else:
        q_raw = tl.load(q_ptr + tok * (H * D) + heads[:, None] * D + tl.arange(0, D)[None, :],
                        mask=head_ok[:, None], other=0)
        q = q_raw.to(tl.float8e4nv, bitcast=True)
    w = tl.load(w_ptr + tok * H + heads, mask=head_ok, other=0.0)
    end = tl.load(end_ptr + tok)
    table_row = block_table_ptr + tl.load(seq_ids_ptr + tok).to(tl.int64) * block_table_stride
    keys_in_block = tl.arange(0, BLOCK_N)
    # every column up to n_cols is written (-inf past end); blocks past end read cache block 0
    for blk in tl.range(tl.program_id(1), tl.cdiv(n_cols, BLOCK_N), tl.num_programs(1), num_stages=NUM_STAGES):
        col0 = blk * BLOCK_N
        page = tl.load(table_row + col0 // block_size, mask=col0 < end, other=0)
        row0 = page * block_size + col0 % block_size
        if SCALES_TMA:
            scale_bits = scales_desc.load([row0])
        else:
            scale_bits = tl.load(scales_ptr + row0.to(tl.int64) + keys_in_block)
        if MXFP4 and DOT_SCALED:  # the nibbles and group scales as they lie: an MX dot (emulated on Hopper)
            group_scales = ((scale_bits[:, None] >> (8 * tl.arange(0, D // 32))[None, :]) & 0xFF).to(tl.uint8)
            scores = tl.dot_scaled(values_desc.load([row0, 0]), group_scales, "e2m1", tl.trans(q), None, "e4m3")
            key_factor = tl.full((BLOCK_N,), 1.0, tl.float32)
        elif MXFP4:
            scores = _mxfp4_block_scores(values_desc, scale_bits, row0, q0, q1, q2, q3, D)
            key_factor = tl.full((BLOCK_N,), 1.0, tl.float32)
        else:
            keys = values_desc.load([row0, 0])  # e4m3 as stored: the dot can read it where the copy left it
            scores = tl.dot(keys, tl.trans(q))  # [BLOCK_N, BLOCK_H]
            key_factor = scale_bits.to(tl.float32, bitcast=True)
        logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :], axis=1) * key_factor
        cols = col0 + keys_in_block
        logits = tl.where(cols < end, logits, float("-inf"))
        tl.store(out_ptr + tok.to(tl.int64) * n_cols + cols, logits, mask=cols < n_cols)


@dataclass(frozen=True)
class TmaConfig:
    """Keys per block (divides the cache block size), warps, programs per multiprocessor, key blocks
    in flight per program (the loop's pipelining depth), and whether the scales come by a bulk copy
    too (else plain vector loads, pipelined the same way)."""

    block_n: int = 64
    num_warps: int = 4
    programs_per_sm: int = 8
    num_stages: int = 3
    scales_tma: bool = False
    # MXFP4: one tl.dot_scaled per block on the packed nibbles and their group scales, instead of the group dots
    dot_scaled: bool = False

    def label(self) -> str:
        return (f"tma n{self.block_n} w{self.num_warps} p{self.programs_per_sm} s{self.num_stages}"
                f"{' scales-tma' if self.scales_tma else ''}{' dot-scaled' if self.dot_scaled else ''}")


def split_key_cache(rows: torch.Tensor, key_dtype: str, d_i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Today's rows [num_slots, row bytes] -> (values, scales): fp8 values float8_e4m3fn [num_slots, d_I]
    (the bytes as they are), MXFP4 values int32 [num_slots, d_I / 8] (nibble words); scales int32
    [num_slots] (fp8: the fp32 scale's bits; MXFP4: group g's ue8m0 byte in bits 8g..)."""
    if indexer_row_bytes(d_i, key_dtype) != rows.shape[1]:
        raise ValueError(f"split_key_cache: rows of {rows.shape[1]} bytes are not d_I={d_i} {key_dtype} rows")
    value_bytes = d_i if key_dtype == "fp8" else d_i // 2
    values = rows[:, :value_bytes].contiguous()
    scale_bytes = torch.zeros(rows.shape[0], 4, dtype=torch.uint8, device=rows.device)  # d_I < 128: fewer groups
    scale_bytes[:, : rows.shape[1] - value_bytes] = rows[:, value_bytes:]
    scales = scale_bytes.view(torch.int32).reshape(-1)
    return values.view(torch.float8_e4m3fn if key_dtype == "fp8" else torch.int32), scales


def indexer_decode_tma(q_fp8: torch.Tensor, weights: torch.Tensor, values: torch.Tensor, scales: torch.Tensor,
                       key_dtype: str, block_table: torch.Tensor, seq_ids: torch.Tensor, end: torch.Tensor,
                       block_size: int, n_cols: int, config: TmaConfig) -> torch.Tensor:
    """fp32 [T, n_cols] logits of one query token per row (-inf past end[t]) over split keys
    (split_key_cache), on contiguous int32 paged inputs and a GPU with fp8 dots (or the interpreter)."""
    t, h, d = q_fp8.shape
    if block_size % config.block_n:
        raise ValueError(f"TmaConfig.block_n={config.block_n} must divide the cache block size {block_size}")
    out = new_output((t, n_cols), torch.float32, q_fp8.device)
    if t == 0 or n_cols == 0:
        return out
    _launch(out, q_fp8, weights, values, scales, key_dtype, block_table, seq_ids, end, block_size, config)
    return out


def _launch(out, q_fp8, weights, values, scales, key_dtype, block_table, seq_ids, end, block_size, config):
    """One launch of the kernel into out; returns the compiled kernel (its registers, TTGIR)."""
    t, h, d = q_fp8.shape
    n_cols = out.shape[1]
    mxfp4 = key_dtype == "mxfp4"
    dot_scaled = mxfp4 and config.dot_scaled
    if dot_scaled:  # the nibble bytes of a whole row as one block
        values_desc = TensorDescriptor.from_tensor(values.view(torch.uint8), [config.block_n, d // 2])
    else:
        values_desc = TensorDescriptor.from_tensor(values, [config.block_n, 4 if mxfp4 else d])
    scales_desc = TensorDescriptor.from_tensor(scales, [config.block_n])
    grid = (t, row_programs(t, triton.cdiv(n_cols, config.block_n), q_fp8.device, config.programs_per_sm))
    return _indexer_decode_tma_kernel[grid](
        q_fp8, weights, values_desc, scales, scales_desc, out, block_table, seq_ids, end,
        n_cols, block_table.stride(0), block_size,
        H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)), BLOCK_N=config.block_n, MXFP4=mxfp4,
        SCALES_TMA=config.scales_tma, NUM_STAGES=config.num_stages, DOT_SCALED=dot_scaled,
        num_warps=config.num_warps,
    )


# ---------------------------------------------------------------- GPU measurement

# (the first of each is the one whose TTGIR is saved). Local compiles for sm_90 (triton 3.9) showed the
# loop's values buffers: 1 at num_stages 1, 2 at 2-4, 3 at 5 (the page's table load takes a stage).
TMA_CONFIGS = {
    "fp8": (TmaConfig(num_stages=3), TmaConfig(num_stages=2), TmaConfig(num_stages=5), TmaConfig(num_stages=1),
            TmaConfig(num_stages=3, programs_per_sm=16), TmaConfig(num_stages=5, programs_per_sm=16),
            TmaConfig(num_stages=3, programs_per_sm=4), TmaConfig(num_stages=3, scales_tma=True),
            TmaConfig(num_stages=3, num_warps=8), TmaConfig(block_n=32, num_stages=5, programs_per_sm=16),
            TmaConfig(num_stages=6, programs_per_sm=16), TmaConfig(num_stages=5, programs_per_sm=24)),
    "mxfp4": (TmaConfig(num_stages=2), TmaConfig(num_stages=1), TmaConfig(num_stages=3), TmaConfig(num_stages=5),
              TmaConfig(num_stages=1, programs_per_sm=4), TmaConfig(num_stages=2, programs_per_sm=4),
              TmaConfig(num_stages=2, scales_tma=True), TmaConfig(num_stages=2, num_warps=8),
              TmaConfig(num_stages=1, num_warps=8), TmaConfig(num_stages=6), TmaConfig(num_stages=7),
              TmaConfig(num_stages=5, programs_per_sm=12), TmaConfig(num_stages=5, scales_tma=True),
              TmaConfig(num_stages=6, scales_tma=True), TmaConfig(num_stages=1, dot_scaled=True),
              TmaConfig(num_stages=3, dot_scaled=True), TmaConfig(num_stages=5, dot_scaled=True),
              TmaConfig(num_stages=5, num_warps=8, dot_scaled=True)),
}
CONTEXT, HEADS, BLOCK_SIZE = 65536, 64, 64


def _kernel_bench():
    """benchmarks/kernels.py as a module (its cache builders, reference check and timer)."""
    spec = importlib.util.spec_from_file_location("kernel_bench", Path(__file__).resolve().parent / "kernels.py")
    assert spec is not None and spec.loader is not None
    kb = importlib.util.module_from_spec(spec)
    sys.modules["kernel_bench"] = kb  # its dataclasses look their module up
    spec.loader.exec_module(kb)
    return kb


def compile_report(handle) -> str:
    """Registers, spills, shared memory, the TTGIR's copies, waits and dots, and the SASS's largest
    loop (instructions per key block per warp, its most frequent opcodes) of one compiled variant."""
    import re
    import subprocess
    import tempfile
    from collections import Counter

    ttgir = handle.asm["ttgir"]
    ops = {name: ttgir.count(op) for name, op in (
        ("tma", "async_tma_copy_global_to_local"), ("cp.async", "ttg.async_copy_global_to_local"),
        ("wait_barrier", "wait_barrier"), ("wgmma", "warp_group_dot "), ("mma", "tt.dot "))}
    buffers = Counter(re.findall(r"local_alloc : \(\) -> !ttg.memdesc<([0-9x]+[a-zA-Z0-9]+)", ttgir))
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(handle.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)]
    loops = []
    for addr, text in code:
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            loops.append([t for a, t in code if int(target.group(1), 16) <= a <= addr])
    body = max(loops, key=len, default=[])
    mix = Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in body)
    return (f"regs {handle.n_regs} spills {handle.n_spills} smem {handle.metadata.shared} "
            + " ".join(f"{k} {v}" for k, v in ops.items()) + f" buffers {dict(buffers)} | loop {len(body)}: "
            + " ".join(f"{op} {n}" for op, n in mix.most_common(12)))


def decode_case(kb, key_dtype: str, requests: int, copy_tbps: float, out_dir: Path | None,
                only: set[str] | None = None) -> None:
    from kernels.indexer import indexer_logits_paged  # kernels/indexer.py: today's default path

    cache = kb.make_indexer_cache(requests * CONTEXT, key_dtype)
    values, scales = split_key_cache(cache, key_dtype, kb.D_I)
    table = torch.randperm(requests * CONTEXT // BLOCK_SIZE, device="cuda").int().reshape(requests, -1)
    seq_ids = torch.arange(requests, device="cuda", dtype=torch.int32)
    lens = torch.full((requests,), CONTEXT, device="cuda", dtype=torch.int32)
    short = lens - torch.arange(requests, device="cuda", dtype=torch.int32) * 7
    sets = [kb.indexer_query(requests, HEADS) for _ in range(3)]
    q, w = sets[0]
    refs = [(n, kb.indexer_logits_paged_torch(q, w, cache, key_dtype, table, BLOCK_SIZE, seq_ids, n, CONTEXT))
            for n in (lens, short)]
    nbytes = requests * CONTEXT * (indexer_row_bytes(kb.D_I, key_dtype) + 4) + requests * HEADS * (kb.D_I + 4)

    def today(q, w, n):
        return indexer_logits_paged(q, w, cache, key_dtype, table, BLOCK_SIZE, seq_ids, n, CONTEXT)

    launches = [("today (rows, default)", today, None)]
    for cfg in TMA_CONFIGS[key_dtype]:
        if only is not None and cfg.label() not in only:
            continue
        launches.append((cfg.label(), lambda q, w, n, cfg=cfg: indexer_decode_tma(
            q, w, values, scales, key_dtype, table, seq_ids, n, BLOCK_SIZE, CONTEXT, cfg), cfg))
    launches.append(("today again (A/A)", today, None))
    for name, launch, cfg in launches:
        case = f"{key_dtype:<6} {requests}x{CONTEXT} H{HEADS} {name:<32}"
        try:
            ok, diff = True, 0.0
            for n, ref in refs:  # full and staggered contexts, outputs poisoned
                with kb.poisoned_outputs():
                    got = launch(q, w, n)
                matched, d = kb.logits_match(got, ref)
                ok, diff = ok and matched, max(diff, d)
            ms = kb.bench([lambda q=q, w=w, launch=launch: launch(q, w, lens) for q, w in sets])
        except Exception as exc:  # a config the compiler cannot fit is reported and skipped
            print(f"{case} {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        gbps = nbytes / ms / 1e6
        print(f"{case} {'ok' if ok else 'FAIL'} (diff {diff:.1e}) {ms * 1e3:8.1f} us {gbps:6.0f} GB/s "
              f"{100 * gbps / (copy_tbps * 1e3):4.0f}% of copy measured, {100 * gbps / (kb.COPY_TBPS * 1e3):4.0f}% of "
              f"{kb.COPY_TBPS}", flush=True)
        if cfg is not None and requests == 64:
            handle = _launch(torch.empty(requests, CONTEXT, device="cuda"), q, w, values, scales, key_dtype, table,
                             seq_ids, lens, BLOCK_SIZE, cfg)
            print(f"    compiled: {compile_report(handle)}", flush=True)
            if out_dir is not None and cfg == TMA_CONFIGS[key_dtype][0] and only is None:
                (out_dir / f"tma_{key_dtype}.ttgir").write_text(handle.asm["ttgir"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key-dtypes", default="fp8,mxfp4", help="comma list of key formats")
    parser.add_argument("--requests", default="64,16", help="comma list of decode batch sizes (64k keys each)")
    parser.add_argument("--configs", default=None,
                        help="comma list of config labels to time (as printed, e.g. 'tma n64 w4 p16 s5'); default all")
    parser.add_argument("--out", type=Path, default=None, help="folder for the first config's TTGIR per format")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/indexer_tma_proto.py needs a CUDA GPU", file=sys.stderr)
        return 2
    kb = _kernel_bench()
    torch.manual_seed(0)
    copy_tbps, _ = kb.measure_ceilings()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy {copy_tbps:.2f} TB/s measured here", flush=True)
    only = None if args.configs is None else {c.strip() for c in args.configs.split(",")}
    for key_dtype in args.key_dtypes.split(","):
        for requests in (int(r) for r in args.requests.split(",")):
            decode_case(kb, key_dtype, requests, copy_tbps, args.out, only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
