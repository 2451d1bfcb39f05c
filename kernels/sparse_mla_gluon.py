"""Sparse MLA through the Gluon kernels: their configs, the check that the device and the installed
Triton can run one, and the launcher, with sparse_mla_triton's signature and results (the same split
of the index list, partials and combine kernel).

Gluon kernels are written for one architecture and do not run in the Triton interpreter. Hopper
(sm_90: H100, H200) runs kernels/sparse_mla_gluon_kernel.py; AMD CDNA3 (gfx942: MI300) runs
kernels/sparse_mla_gluon_amd.py, which compiles but has not run on AMD hardware (its results are
checked by benchmarks/gluon_sparse_mla.py before any timing, as Hopper's). The backend name "gluon"
(kernels/backend.py) selects them for sparse MLA and the Triton kernels for every other op.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from kernels.quant import DS_MLA_GROUP
from kernels.sparse_mla import LOG2E, choose_splits, combine_splits, kv_views, split_outputs

HOPPER, CDNA3 = "sm_90", "gfx942"  # the targets, as the compiler names them
CONSUMER_WARPS = 8  # two warpgroups share each MMA (kernels/sparse_mla_gluon_kernel.py)
AMD_WAVEFRONTS = 4  # kernels/sparse_mla_gluon_amd.py
BLOCK_H = 64  # heads per program (both kernels take it from here); fewer heads are padded
REGISTERS_PER_SM = 65536


@dataclass(frozen=True)
class GluonMlaConfig:
    """Tiles and partitions of the Gluon kernel: the ring of `num_stages` slots of `block_n` rows, the
    loader partition's warps and registers per thread (the consumer's two warpgroups get the rest
    of the program's register budget, one program per SM)."""

    block_n: int
    num_stages: int
    loader_regs: int
    loader_warps: int = 4
    # programs per SM the automatic split count aims for (the kernel's shared memory holds one)
    programs_per_sm: int = 1

    @property
    def maxnreg(self) -> int:
        """Registers per thread that let one program's warps share an SM's register file."""
        threads = 32 * (CONSUMER_WARPS + self.loader_warps)
        return REGISTERS_PER_SM // threads // 8 * 8

    @property
    def consumer_regs(self) -> int:
        """Registers per consumer thread once the loader partition holds its loader_regs."""
        total = self.maxnreg * (CONSUMER_WARPS + self.loader_warps)
        return (total - self.loader_regs * self.loader_warps) // CONSUMER_WARPS // 8 * 8


# the configs benchmarks/gluon_sparse_mla.py compares on the GPU, the default first: two slots of
# 64 rows (216 KB of shared memory with the query), or four of 32 (N = 16 per warpgroup in Q K^T,
# but twice the rows in flight). fp8 rows pass through the loader's registers, which takes more.
CANDIDATE_CONFIGS = {
    "bf16": (GluonMlaConfig(64, 2, 72), GluonMlaConfig(32, 4, 72)),
    "fp8_ds_mla": (GluonMlaConfig(64, 2, 128), GluonMlaConfig(32, 4, 88)),
}


@dataclass(frozen=True)
class GluonAmdConfig:
    """Tiles of the CDNA3 kernel: `block_n` rows per tile through the 64 KB of LDS (32 rows of bf16
    d_c + d_r = 576 take 36 KB)."""

    block_n: int = 32
    programs_per_sm: int = 1


def default_gluon_config(kv_dtype: str, target: str = HOPPER) -> GluonMlaConfig | GluonAmdConfig:
    return CANDIDATE_CONFIGS[kv_dtype][0] if target == HOPPER else GluonAmdConfig()


@functools.cache
def _import_error(target: str) -> str | None:
    try:
        if target == HOPPER:
            import kernels.sparse_mla_gluon_kernel  # noqa: F401
        else:
            import kernels.sparse_mla_gluon_amd  # noqa: F401
    except ImportError as exc:  # a Triton without triton.experimental.gluon or its ops for the target
        return f"the installed Triton {triton.__version__} has no usable Gluon for {target} ({exc})"
    return None


@functools.cache
def gluon_target(device: torch.device) -> str | None:
    """The Gluon kernels' target `device` is (HOPPER, CDNA3), or None; asked of the device once."""
    if device.type != "cuda":
        return None
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        return CDNA3 if arch.split(":")[0] == CDNA3 else None
    return HOPPER if torch.cuda.get_device_capability(device) == (9, 0) else None


def gluon_unavailable_reason(device: torch.device) -> str | None:
    """Why no Gluon kernel can run on `device`, or None when one can."""
    if (target := gluon_target(device)) is None:
        return (f"it is written for NVIDIA sm_90 (H100, H200) and AMD gfx942 (MI300), got "
                f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else f'a {device.type} device'}")
    return _import_error(target)


def check_gluon_shapes(d_c: int, d_r: int) -> None:
    """ValueError unless the kernel's tiles fit: d_c a power of two from 128 to 512 (fp8 scale groups of
    128; the P V accumulator splits d_c over two warpgroups of at most 256 columns), d_r 64 or 128."""
    if d_c not in (128, 256, 512) or d_c % DS_MLA_GROUP or d_r not in (64, 128):
        raise ValueError(f"backend='gluon': sparse MLA needs d_c in (128, 256, 512) and d_r in (64, 128), "
                         f"got d_c={d_c}, d_r={d_r}")


@functools.cache
def _checked_target(device: torch.device, d_c: int, d_r: int) -> str:
    """The target a launch on `device` compiles for, checked once per device and shapes (every layer's
    launch asks): RuntimeError naming the backend where the device or the installed Triton cannot run
    a Gluon kernel, ValueError where d_c and d_r do not fit its tiles."""
    target = gluon_target(device)
    if target is None or _import_error(target) is not None:
        raise RuntimeError(f"backend='gluon': {gluon_unavailable_reason(device)}; use backend='triton'")
    check_gluon_shapes(d_c, d_r)
    return target


def kernel_constexprs(kv: torch.Tensor, kv_bytes: torch.Tensor, rope_offset: int, kv_dtype: str, d_c: int,
                      d_r: int, split: bool, cfg: GluonMlaConfig | GluonAmdConfig) -> dict[str, int | bool]:
    """A kernel's compile-time arguments for a cache read through kv_views (its bf16 and byte views,
    the rope's offset), shapes and config (one compiled variant each): Hopper's with a GluonMlaConfig,
    CDNA3's with a GluonAmdConfig."""
    shared = dict(KV_STRIDE=kv.shape[1], ROW_BYTES=kv_bytes.shape[1] * kv_bytes.element_size(),
                  ROPE_OFFSET=rope_offset, D_C=d_c, D_R=d_r, BLOCK_N=cfg.block_n, FP8=kv_dtype == "fp8_ds_mla",
                  SPLIT=split)
    if isinstance(cfg, GluonAmdConfig):
        return shared
    return {**shared, "NUM_STAGES": cfg.num_stages, "LOADER_WARPS": cfg.loader_warps, "LOADER_REGS": cfg.loader_regs}


def sparse_mla_gluon(q_c, q_r, kv_cache, indices, scale, kv_dtype, num_splits=None, config=None):
    """sparse_mla_triton's computation by the device's Gluon kernel: q_c [T, H, d_c] and q_r [T, H, d_r]
    (any strides, last dim contiguous), the cache rows at indices int32 [T, K] (-1: none); config
    overrides the tiles (the device's kind of config). RuntimeError naming the backend where the
    device or the installed Triton cannot run it."""
    t, h, d_c = q_c.shape
    d_r = q_r.shape[2]
    target = _checked_target(q_c.device, d_c, d_r)
    n_idx = indices.shape[1]
    cfg = config or default_gluon_config(kv_dtype, target)
    if isinstance(cfg, GluonAmdConfig) != (target == CDNA3):
        raise ValueError(f"backend='gluon': a {type(cfg).__name__} does not configure the {target} kernel")
    head_blocks = triton.cdiv(h, BLOCK_H)
    splits = choose_splits(num_splits, t * head_blocks, n_idx, cfg, kv_cache, d_c, h, q_c.device)
    out, lse, dst_o, dst_lse = split_outputs(t, h, d_c, splits, q_c.device)
    if t == 0:
        return out, lse
    kv, kv_bytes, _, rope_offset = kv_views(kv_cache, kv_dtype, d_c)
    args = (q_c, q_r, kv, kv_bytes, indices, dst_o, dst_lse, q_c.stride(0), q_c.stride(1), q_r.stride(0),
            q_r.stride(1), scale * LOG2E.value, n_idx, h)
    constexprs = kernel_constexprs(kv, kv_bytes, rope_offset, kv_dtype, d_c, d_r, splits > 1, cfg)
    if isinstance(cfg, GluonMlaConfig):
        from kernels.sparse_mla_gluon_kernel import sparse_mla_fwd_kernel

        sparse_mla_fwd_kernel[(t * head_blocks, splits)](*args, **constexprs, num_warps=CONSUMER_WARPS,
                                                          maxnreg=cfg.maxnreg)
    else:
        from kernels.sparse_mla_gluon_amd import sparse_mla_fwd_amd_kernel

        sparse_mla_fwd_amd_kernel[(t * head_blocks, splits)](*args, **constexprs, num_warps=AMD_WAVEFRONTS)
    if splits > 1:
        combine_splits(dst_o, dst_lse, out, lse)
    return out, lse
