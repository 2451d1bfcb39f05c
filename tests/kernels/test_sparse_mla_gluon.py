"""The Gluon sparse-MLA backend without a GPU.

Gluon kernels do not run in the Triton interpreter: they are written for one architecture
(sm_90's warpgroup MMA, cp.async and mbarriers; gfx942's MFMA and LDS) and only compile. So these
tests check what can be checked here: the backend's dispatch (sparse MLA takes the Gluon kernel,
every other op its Triton kernel), the errors for devices and shapes it cannot serve, and that
every variant the launcher can pick (bf16 and fp8_ds_mla rows, with and without the split of the
index list, each config the GPU benchmark compares, the gfx942 kernel) compiles with the Triton
installed here (skipped, with the reason, where that Triton cannot compile Gluon for the target
without a device). Results are checked on an H100/H200 by benchmarks/gluon_sparse_mla.py against
the torch reference; the gfx942 kernel has not run on AMD hardware.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import fp8_e4m3_quantize, get_backend, set_backend, sparse_mla
from kernels.backend import BACKENDS, resolve_backend, runs_compiled_kernels
from kernels.quant import kv_row_width
from kernels.sparse_mla import kv_views
from kernels.sparse_mla_gluon import (
    AMD_WAVEFRONTS,
    CANDIDATE_CONFIGS,
    CDNA3,
    CONSUMER_WARPS,
    HOPPER,
    GluonAmdConfig,
    GluonMlaConfig,
    check_gluon_shapes,
    default_gluon_config,
    gluon_unavailable_reason,
    kernel_constexprs,
)

D_C, D_R = 512, 64  # the V3.2 shapes the kernel is written for
SHARED_PER_BLOCK = 232448  # an sm_90 program's shared memory limit (227 KB)
LDS_PER_BLOCK = 65536  # gfx942's
REPO = Path(__file__).resolve().parents[2]


def test_gluon_is_a_backend_for_sparse_mla_only():
    cpu = torch.device("cpu")
    assert "gluon" in BACKENDS
    assert resolve_backend("gluon", cpu, gluon_kernel=True) == "gluon"
    assert resolve_backend("gluon", cpu) == "triton"  # conftest turned the interpreter on
    assert [b for b in BACKENDS if runs_compiled_kernels(b)] == ["triton", "gluon"]  # captured in CUDA graphs
    try:
        set_backend("gluon")
        assert get_backend() == "gluon"
    finally:
        set_backend(None)


def test_other_ops_run_their_triton_kernels_under_gluon(gen):
    x = torch.randn(8, 64, generator=gen)
    for got, ref in zip(fp8_e4m3_quantize(x, backend="gluon"), fp8_e4m3_quantize(x, backend="triton")):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_sparse_mla_on_a_cpu_names_the_backend(kv_dtype):
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    cache = torch.zeros(8, kv_row_width(D_C, D_R, kv_dtype), dtype=dtype)
    q = torch.zeros(1, 16, D_C + D_R, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="backend='gluon'.*sm_90"):
        sparse_mla(q, cache, torch.zeros(1, 4, dtype=torch.int32), 0.1, D_C, kv_dtype, backend="gluon")
    assert "NVIDIA sm_90" in gluon_unavailable_reason(torch.device("cpu"))


def test_shapes_the_tiles_cannot_hold_are_refused():
    check_gluon_shapes(512, 64)
    check_gluon_shapes(256, 128)
    for d_c, d_r in ((512, 32), (1024, 64), (64, 64), (512, 256)):
        with pytest.raises(ValueError, match="backend='gluon'"):
            check_gluon_shapes(d_c, d_r)


def test_configs_share_an_sm():
    """The register budget of each candidate: one program's 12 warps fit the 64K registers of an
    SM, and the consumer warpgroups keep at least the accumulator's 128 registers and then some."""
    for cfg in {c for configs in CANDIDATE_CONFIGS.values() for c in configs}:
        assert cfg.maxnreg * 32 * (CONSUMER_WARPS + cfg.loader_warps) <= 65536
        assert 184 <= cfg.consumer_regs <= 256 and cfg.loader_regs % 8 == 0


TARGETS = {HOPPER: ("cuda", 90, 32), CDNA3: ("hip", "gfx942", 64)}  # GPUTarget(backend, arch, warp size)


@functools.cache
def _probe_error(target: str) -> str | None:
    """Why this Triton cannot compile Gluon for `target` without a GPU (no Gluon, no backend for the
    target, no assembler), or None: a one-line kernel compiled."""
    try:
        _probe_gluon(target)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _probe_gluon(target: str) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def probe(x_ptr, LANES: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [LANES], [4], [0])
        gl.store(x_ptr + gl.arange(0, 4 * LANES, layout), 1.0)

    lanes = TARGETS[target][2]
    source = gluon._runtime.GluonASTSource(probe, {"x_ptr": "*fp32", "LANES": "constexpr"}, {"LANES": lanes})
    triton_compile(source, target=GPUTarget(*TARGETS[target]))


def compile_variant(target: str, kv_dtype: str, split: bool, cfg: GluonMlaConfig | GluonAmdConfig):
    """The target's kernel compiled as a launch would (kernel_constexprs, pointers 16-byte aligned)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental import gluon

    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    cache = torch.empty(1, kv_row_width(D_C, D_R, kv_dtype), dtype=dtype)
    kv, kv_bytes, _, rope_offset = kv_views(cache, kv_dtype, D_C)
    constexprs = kernel_constexprs(kv, kv_bytes, rope_offset, kv_dtype, D_C, D_R, split, cfg)
    pointers = {"q_c_ptr": "*bf16", "q_r_ptr": "*bf16", "kv_ptr": "*bf16",
                "kv_bytes_ptr": "*bf16" if kv_dtype == "bf16" else "*u8", "idx_ptr": "*i32",
                "o_ptr": "*fp32" if split else "*bf16", "lse_ptr": "*fp32"}
    scalars = {name: "i32" for name in ("q_c_stride_t", "q_c_stride_h", "q_r_stride_t", "q_r_stride_h")}
    signature = {**pointers, **scalars, "sm_scale_log2": "fp32", "n_idx": "i32", "n_heads": "i32",
                 **{name: "constexpr" for name in constexprs}}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers) + len(scalars))}
    if target == HOPPER:
        from kernels.sparse_mla_gluon_kernel import sparse_mla_fwd_kernel as kernel

        options = {"num_warps": CONSUMER_WARPS, "maxnreg": cfg.maxnreg}
    else:
        from kernels.sparse_mla_gluon_amd import sparse_mla_fwd_amd_kernel as kernel

        options = {"num_warps": AMD_WAVEFRONTS}
    source = gluon._runtime.GluonASTSource(kernel, signature, constexprs, aligned)
    return triton_compile(source, target=GPUTarget(*TARGETS[target]), options=options)


VARIANTS = ([(HOPPER, kv_dtype, split, cfg) for kv_dtype, configs in CANDIDATE_CONFIGS.items()
             for cfg in configs for split in (False, True)]
            + [(CDNA3, kv_dtype, split, GluonAmdConfig()) for kv_dtype in CANDIDATE_CONFIGS for split in (False, True)])
VARIANT_IDS = [f"{target}-{d}-{'split' if s else 'whole'}-n{c.block_n}"
               + (f"s{c.num_stages}r{c.loader_regs}" if isinstance(c, GluonMlaConfig) else "")
               for target, d, s, c in VARIANTS]
MARKS = ("wgmma.mma_async", "mbarrier.try_wait", "setmaxnreg", "cp.async.cg.shared.global",
         "cp.async.mbarrier.arrive.noinc", "cvt.rn.f16x2.e4m3x2", "v_mfma_f32_16x16x16_bf16")


def compile_report() -> dict:
    """Every variant compiled: {variant id: {"shared": bytes, "marks": [MARKS found in its PTX or
    AMDGCN]} or {"error": ...}, or {"unavailable": why} where this Triton cannot compile Gluon for
    the variant's target without a GPU}."""
    report: dict = {}
    for vid, (target, kv_dtype, split, cfg) in zip(VARIANT_IDS, VARIANTS):
        if (error := _probe_error(target)) is not None:
            report[vid] = {"unavailable": error}
            continue
        try:
            compiled = compile_variant(target, kv_dtype, split, cfg)
        except Exception as exc:  # reported per variant: one that does not compile hides no other
            report[vid] = {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
            continue
        code = compiled.asm["ptx"] if target == HOPPER else compiled.asm["amdgcn"]
        report[vid] = {"shared": compiled.metadata.shared, "marks": [m for m in MARKS if m in code]}
    return report


@pytest.fixture(scope="module")
def compiled_variants() -> dict:
    """compile_report() in a fresh interpreter with the Triton interpreter off: compiling Gluon in
    the process that runs interpreted Triton kernels (this package's conftest) fails, because the
    Triton functions Gluon reuses (gl.max, gl.sum, gl.cdiv) are interpreter objects there."""
    code = ("import json; from tests.kernels.test_sparse_mla_gluon import compile_report; "
            "print('REPORT', json.dumps(compile_report()))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "0"},
                         capture_output=True, text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if line.startswith("REPORT ")]
    assert run.returncode == 0 and lines, f"the compile run failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("REPORT "))


@pytest.mark.parametrize("vid", VARIANT_IDS)
def test_every_variant_compiles(compiled_variants, vid):
    result = compiled_variants[vid]
    if "unavailable" in result:
        pytest.skip(f"this Triton cannot compile Gluon for {vid.split('-')[0]} without a GPU: {result['unavailable']}")
    assert "error" not in result, result.get("error")
    marks = set(result["marks"])
    if vid.startswith(CDNA3):
        assert result["shared"] <= LDS_PER_BLOCK and "v_mfma_f32_16x16x16_bf16" in marks
        return
    assert result["shared"] <= SHARED_PER_BLOCK
    assert {"wgmma.mma_async", "mbarrier.try_wait", "setmaxnreg"} <= marks
    # bf16 rows come by cp.async, each loader thread's copies arriving on the slot's barrier;
    # fp8 rows through the loader's registers, dequantised by the hardware e4m3 conversion
    if "-bf16-" in vid:
        assert {"cp.async.cg.shared.global", "cp.async.mbarrier.arrive.noinc"} <= marks
    else:
        assert "cvt.rn.f16x2.e4m3x2" in marks and "cp.async.cg.shared.global" not in marks


def test_default_configs_are_candidates():
    for kv_dtype in CANDIDATE_CONFIGS:
        assert default_gluon_config(kv_dtype) == CANDIDATE_CONFIGS[kv_dtype][0]
        assert default_gluon_config(kv_dtype, CDNA3) == GluonAmdConfig()
