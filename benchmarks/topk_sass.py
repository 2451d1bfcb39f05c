"""Instructions per column of the top-k kernels' inner loops, from their SASS, without a GPU.

Compiles each kernel of kernels/topk/ for a CUDA target with the installed Triton (its bundled
ptxas and cuobjdump), finds the loops (backward branches) of the SASS and prints, for each loop
over a block of columns, its instruction count per column per warp: an issue-count model of the
full-row passes where no profiler counter can be read. A loop is listed once for itself and
once more inside each enclosing loop (a few instructions larger).
The Triton version matters: 3.6 lowers tl.histogram to ballots and popcounts, later versions to
shared-memory atomics, so run it with the Triton the GPU runs.

    PYTHONPATH=. python benchmarks/topk_sass.py [--arch 90]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

# Compile, do not interpret: must be set before kernels (which defaults it to 1) imports triton.
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.topk import compacting, in_registers, sampled  # noqa: E402
from kernels.topk.config import SAMPLE_COLS  # noqa: E402

_PTRS = {"logits_ptr": "*fp32", "lengths_ptr": "*i32", "out_ptr": "*i32", "hist_ptr": "*i32"}
_SIGNATURES = {
    "_histogram_pass_kernel": {"logits_ptr": "*fp32", "lengths_ptr": "*i32", "hist_ptr": "*i32", "n_cols": "i32",
                               "k": "i32", "level": "i32"},
    "_split_kernel": {**_PTRS, "count_ptr": "*i32", "cand_ptr": "*i32", "n_cols": "i32", "k": "i32", "cap": "i32"},
    "_finish_kernel": {**_PTRS, "cand_ptr": "*i32", "bits_ptr": "*i32", "n_cols": "i32", "k": "i32", "cap": "i32"},
    "_sample_kernel": {"logits_ptr": "*fp32", "lengths_ptr": "*i32", "count_ptr": "*i32", "n_cols": "i32",
                       "k": "i32"},
    "_mark_kernel": {"logits_ptr": "*fp32", "lengths_ptr": "*i32", "count_ptr": "*i32", "bits_ptr": "*i32",
                     "n_cols": "i32", "k": "i32", "words_stride": "i32"},
    "_sampled_finish_kernel": {k: v for k, v in _PTRS.items() if k != "hist_ptr"} | {"count_ptr": "*i32", "bits_ptr": "*i32", "list_ptr": "*i32",
                               "n_cols": "i32", "k": "i32", "words_stride": "i32", "table_ptr": "*i32",
                               "seq_ids_ptr": "*i32", "table_stride": "i32"},
    "_topk_in_registers_kernel": {k: v for k, v in _PTRS.items() if k != "hist_ptr"} | {
        "n_cols": "i32", "k": "i32", "table_ptr": "*i32", "seq_ids_ptr": "*i32", "table_stride": "i32"},
}
# (kernel, constexprs, num_warps): the defaults' grids (histogram levels past 32k columns: 2,048-column
# steps; the finish ordering v32's k of 2,048) and a 4096-column block
CASES = (("_histogram_pass_kernel", {"CHUNK": 2048, "BLOCK": 1024}, 4),
         ("_histogram_pass_kernel", {"CHUNK": 2048, "BLOCK": 2048}, 4),
         ("_histogram_pass_kernel", {"CHUNK": 4096, "BLOCK": 4096}, 4),
         ("_split_kernel", {"CHUNK": 2048, "BLOCK": 1024}, 4),
         ("_finish_kernel", {"BLOCK": 512, "K_BLOCK": 2048, "W_BLOCK": compacting.ORDER_WORDS_BLOCK}, 4),
         # the sampled path (its default past 8,192 columns): the sample's search (steps over 8,192
         # keys), the mark pass, the finish (its loops: bitmap to list, the search, the fallback's)
         ("_sample_kernel", {"SAMPLE": SAMPLE_COLS}, 8),
         ("_mark_kernel", {"CHUNK": 2048, "BLOCK": 1024}, 4),
         ("_sampled_finish_kernel", {"BLOCK_SIZE": 64, "TO_SLOTS": True, "CAP": 4096,
                                     "W_BLOCK": sampled.LIST_WORDS_BLOCK, "BLOCK": 1024}, 8),
         # the decode rows' kernel, writing cache slots (its loops: the search steps of the full and
         # the half block, each step's compares a column; and the short rows' store)
         ("_topk_in_registers_kernel", {"BLOCK_SIZE": 64, "TO_SLOTS": True, "BLOCK": 8192}, 8))


def sass_of(name: str, constexprs: dict, num_warps: int, arch: int) -> str:
    fn = next(getattr(m, name) for m in (compacting, sampled, in_registers) if hasattr(m, name))
    signature = {**_SIGNATURES[name], **{c: "constexpr" for c in constexprs}}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True, check=True).stdout


def loops(sass: str) -> list[list[str]]:
    """Instruction bodies of the SASS's loops, one per backward branch, in address order."""
    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)]
    found = []
    for addr, text in code:
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            found.append([t for a, t in code if int(target.group(1), 16) <= a <= addr])
    return found


def opcode(instr: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", instr).split()[0].split(".")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability as an integer (90: Hopper)")
    args = parser.parse_args(argv)
    print(f"triton {triton.__version__}, sm_{args.arch}; per column: warp instructions of one loop step / the "
          "columns one warp takes in it (a loop that is not per column, such as the replay, reads as small)")
    for name, constexprs, num_warps in CASES:
        sass = sass_of(name, constexprs, num_warps, args.arch)
        per_warp = constexprs.get("BLOCK", constexprs.get("SAMPLE")) // num_warps  # columns a warp takes a step
        print(f"{name} {constexprs} w{num_warps}:")
        for body in loops(sass):
            mix = Counter(opcode(i) for i in body)
            detail = " ".join(f"{op} {mix[op]}" for op in ("VOTE", "POPC", "ATOMS", "ATOMG", "SHFL", "BAR") if mix[op])
            print(f"  loop of {len(body):5d} instructions: {len(body) / per_warp:5.2f} per column  ({detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
