"""Triton device helpers shared by the kernels: byte unpacking, bit-exact fp8 / e2m1 / ue8m0 decode, and
fp32 values as integer keys in the same order (top-k, argmax).

Every decode is integer bit arithmetic on raw bytes (no hardware fp8 type), so it is exact on
CUDA, on ROCm (native fp8 there is the fnuz variant) and in the interpreter. e4m3 and e2m1 are
decoded to *raw* fp16: the bits are placed in an fp16 whose exponent bias is larger, so the value
comes out divided by a fixed power of two (E4M3_RAW_SCALE, E2M1_RAW_SCALE) that the caller folds
into a scale. fp16 keeps subnormals on every target, so e4m3 subnormals stay exact.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

E4M3_RAW_SCALE = tl.constexpr(256.0)  # e4m3 value = raw fp16 * 2^8   (bias 15 - 7)
E2M1_RAW_SCALE = tl.constexpr(16384.0)  # e2m1 value = raw fp16 * 2^14 (bias 15 - 1)
E2M1_RAW_E4M3_SCALE = tl.constexpr(64.0)  # e2m1 value = raw e4m3 * 2^6 (bias 7 - 1)


@triton.jit
def e4m3_to_raw_f16(b):
    """e4m3 bytes (int32 0..255) -> fp16 equal to value / 2^8; 0x7F/0xFF -> NaN."""
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    raw = bits.to(tl.int16).to(tl.float16, bitcast=True)
    return tl.where((b & 0x7F) == 0x7F, float("nan"), raw)


@triton.jit
def e2m1_to_raw_f16(n):
    """e2m1 nibbles (int32 0..15) -> fp16 equal to value / 2^14."""
    bits = ((n & 0x8) << 12) | ((n & 0x7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


E4M3_SIGN_BITS = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as an int32: bit 7 of each byte


@triton.jit
def e2m1_words_to_raw_e4m3(words):
    """int32 words of packed e2m1 nibbles -> (low nibbles, high nibbles), each a word of four e4m3
    bytes equal to value / 2^6, byte i from byte i's nibble: the sign moves to bit 7 and exponent
    and mantissa land in the low exponent bits and the top mantissa bit (0.5, e2m1's only
    subnormal, becomes e4m3's subnormal 2^-7). Four bytes per shift and mask, no per-element
    unpacking; the bits a shift carries across a byte boundary are masked off."""
    low = ((words << 4) & E4M3_SIGN_BITS) | ((words << 2) & 0x1C1C1C1C)
    high = (words & E4M3_SIGN_BITS) | ((words >> 2) & 0x1C1C1C1C)
    return low, high


@triton.jit
def word_bytes(words):
    """int32 words [R, n] -> uint8 [R, 4n], the bytes in memory order (little-endian): rows loaded
    a word at a time (one load per 4 bytes, where the rows are only 4-byte aligned) become bytes."""
    b0 = words.to(tl.uint8)
    b1 = (words >> 8).to(tl.uint8)
    b2 = (words >> 16).to(tl.uint8)
    b3 = (words >> 24).to(tl.uint8)
    return tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (words.shape[0], 4 * words.shape[1]))


@triton.jit
def ue8m0_to_f32(b):
    """ue8m0 scale bytes (int32) -> fp32 2^(b-127); 0 -> 0, 0xFF -> NaN."""
    value = (b << 23).to(tl.float32, bitcast=True)
    return tl.where(b == 0xFF, float("nan"), value)


@triton.jit
def f32_to_bf16(x):
    """fp32 -> bf16 rounding to nearest even by bit arithmetic (the interpreter's cast truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (NaN above +inf)."""
    bits = x.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) != 0, tl.full(bits.shape, 0xFFFFFFFF, tl.uint32),
                    tl.full(bits.shape, 0x80000000, tl.uint32))
    return bits ^ flip


@triton.jit
def round_to(x, TO_BF16: tl.constexpr):
    """fp32 rounded to the output dtype's precision (bf16 by bit arithmetic: the interpreter truncates)."""
    if TO_BF16:
        return f32_to_bf16(x).to(tl.float32)
    return x


def dot_dtype(t: torch.Tensor, gpu: tl.dtype = tl.bfloat16) -> tl.dtype:
    """Operand type for a 16-bit tl.dot: `gpu` (bf16 or fp16) on a GPU; fp32 in the interpreter,
    whose 16-bit dots are wrong.

    The operands hold values exact in the 16-bit type either way, so only the summation order differs.
    """
    return tl.float32 if t.device.type == "cpu" else gpu


@functools.cache
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device, asked once: the property lookup cost a call per launch."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def row_programs(rows: int, blocks: int, device: torch.device, per_sm: int = 4, one_wave: bool = False) -> int:
    """Programs per row for kernels that loop over a row's blocks (grid rows x programs).

    Enough programs to give every multiprocessor about `per_sm`, never more than the row has blocks.
    With `one_wave` (per_sm being how many of the kernel's programs an SM holds at once) never more
    than per_sm x SMs in all: rounding up would leave a few programs to run after all the others.
    The count depends only on the shapes, so a captured CUDA graph keeps a fixed grid while each
    program's loop bound (a row's length, read on the device) varies from replay to replay. In
    the interpreter two programs per row exercise the loop at little cost.
    """
    if device.type != "cuda":
        return max(1, min(blocks, 2))
    return programs_per_row(rows, blocks, per_sm * sm_count(device), one_wave)


def programs_per_row(rows: int, blocks: int, slots: int, one_wave: bool = False) -> int:
    """row_programs for a device of `slots` programs (per_sm x SMs)."""
    rows = max(1, rows)
    target = slots // rows if one_wave else -(-slots // rows)
    return max(1, min(blocks, target))


def programs_resident(n_regs: int, shared_bytes: int, num_warps: int, regs_per_sm: int, shared_per_sm: int,
                      threads_per_sm: int) -> int:
    """How many programs of a compiled kernel (n_regs registers a thread, shared_bytes of shared
    memory a program) one NVIDIA multiprocessor holds at once: registers go to warps in units of
    256, and the runtime reserves 1 KB of shared memory per program beside the kernel's own."""
    by_threads = threads_per_sm // (32 * num_warps)
    warp_regs = -(-n_regs * 32 // 256) * 256
    by_regs = regs_per_sm // warp_regs // num_warps if warp_regs else by_threads
    return max(1, min(by_regs, shared_per_sm // (shared_bytes + 1024), by_threads))


@functools.cache
def sm_resources(device: torch.device) -> tuple[int, int, int] | None:
    """(registers, shared memory bytes, threads) of one multiprocessor of an NVIDIA device, or
    None where the count above does not apply (ROCm's compute units allocate otherwise) or torch
    does not report them."""
    props = torch.cuda.get_device_properties(device)
    fields = ("regs_per_multiprocessor", "shared_memory_per_multiprocessor", "max_threads_per_multi_processor")
    if torch.version.hip is not None or not all(hasattr(props, f) for f in fields):
        return None
    return tuple(getattr(props, f) for f in fields)


def kernel_residency(compiled: object, device: torch.device) -> int | None:
    """programs_resident of a kernel as compiled (what a launch returns: its registers and shared
    memory are known once it is loaded), or None where that cannot be read."""
    sm = sm_resources(device) if device.type == "cuda" else None
    n_regs = getattr(compiled, "n_regs", None)
    metadata = getattr(compiled, "metadata", None)
    if sm is None or not n_regs or metadata is None:
        return None
    return programs_resident(n_regs, metadata.shared, metadata.num_warps, *sm)


_poison = False


class poisoned_outputs:
    """Context manager: kernels fill their outputs with garbage (NaN, -7777, 0xFF) before launching.

    Tests use it to prove that every output element is written by the kernel.
    """

    def __enter__(self) -> None:
        global _poison
        _poison = True

    def __exit__(self, *exc: object) -> None:
        global _poison
        _poison = False


def new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty, or a poisoned tensor inside `poisoned_outputs()`."""
    if not _poison:
        return torch.empty(shape, dtype=dtype, device=device)
    # uint8 outputs are fp8 bytes: 0xFF is e4m3 NaN, which no encoder writes for finite input
    fill = float("nan") if dtype.is_floating_point else 0xFF if dtype == torch.uint8 else -7777
    return torch.full(shape, fill, dtype=dtype, device=device)
