"""Quantisation formats and cache layouts: fp8 e4m3, MXFP4, the fp8_ds_mla KV row, the indexer key
cache's blocks, cache writers.

Decoding works on the raw uint8 bits with integer arithmetic, so the same numbers come out on
CUDA, on ROCm (whose native fp8 is the fnuz variant) and in the Triton interpreter.
Conventions (OCP): e4m3 0x7F/0xFF decode to NaN (the encoder never writes them, it saturates at
448 = 0x7E); e2m1 nibbles hold the even element in the low half of each byte; a ue8m0 scale byte
b means 2^(b-127), with 0xFF NaN and 0x00 read as 0 (the encoder writes 1..254 only).
"""

from __future__ import annotations

import functools

import torch

from kernels.backend import resolve_backend, values_checkable
from kernels.quant_kernels import fp8_e4m3_quantize_triton, mxfp4_quantize_triton

E4M3_MAX = 448.0
E2M1_MAX = 6.0
MX_BLOCK = 32
DS_MLA_GROUP = 128  # fp8_ds_mla: one fp32 scale per this many latent values
KV_DTYPES = ("bf16", "fp8_ds_mla")
KEY_DTYPES = ("fp8", "mxfp4")

# Magnitudes of e2m1 codes 0..7 and the midpoints between neighbours (for rounding).
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _check_choice(value: str, choices: tuple[str, ...], name: str) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {choices}")


def kv_row_bytes(d_c: int, d_r: int, kv_dtype: str) -> int:
    """Bytes of one KV cache row: [c ; k_pe] in bf16, or the fp8_ds_mla layout."""
    _check_choice(kv_dtype, KV_DTYPES, "kv_dtype")
    if kv_dtype == "bf16":
        return 2 * (d_c + d_r)
    if d_c % DS_MLA_GROUP:
        raise ValueError(f"d_c={d_c}: fp8_ds_mla needs a multiple of {DS_MLA_GROUP}")
    return d_c + 4 * (d_c // DS_MLA_GROUP) + 2 * d_r


def kv_row_width(d_c: int, d_r: int, kv_dtype: str) -> int:
    """Columns of the flattened KV cache tensor (bf16 elements or bytes)."""
    return d_c + d_r if kv_dtype == "bf16" else kv_row_bytes(d_c, d_r, kv_dtype)


INDEXER_SCALE_BYTES = 4  # one 32-bit scale word per indexer key


def indexer_value_bytes(d_i: int, key_dtype: str) -> int:
    """Bytes of one indexer key's values: d_I e4m3, or d_I/2 of e2m1 nibbles (at most four 32-value
    groups, whose ue8m0 scale bytes fill the key's scale word)."""
    _check_choice(key_dtype, KEY_DTYPES, "key_dtype")
    if key_dtype == "fp8":
        return d_i
    if d_i % MX_BLOCK or d_i > INDEXER_SCALE_BYTES * MX_BLOCK:
        raise ValueError(f"d_i={d_i}: mxfp4 keys need a multiple of {MX_BLOCK} up to {INDEXER_SCALE_BYTES * MX_BLOCK}")
    return d_i // 2


def indexer_row_bytes(d_i: int, key_dtype: str) -> int:
    """Bytes one indexer key takes: its values (indexer_value_bytes) and its scale word (fp8: the fp32
    scale; MXFP4: group g's ue8m0 byte at byte g, zero past the key's groups)."""
    return indexer_value_bytes(d_i, key_dtype) + INDEXER_SCALE_BYTES


# ---------------------------------------------------------------- fp8 e4m3


def _pow2_ceil(r: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= r (r > 0), exactly (frexp, not a rounded log2)."""
    mant, exp = torch.frexp(r)
    exp = torch.where(mant == 0.5, exp - 1, exp)
    return torch.ldexp(torch.ones_like(r), exp)


def fp8_e4m3_quantize(x: torch.Tensor, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise each row of x[..., D] to e4m3 bytes with a power-of-two scale 2^ceil(log2(amax/448)).

    backend "triton" (the default on a GPU) runs kernels/quant_kernels.py's single kernel, with the
    same bytes and scales; "torch" is the reference below."""
    d = x.shape[-1] if x.dim() else 0
    if d >= 16 and d & (d - 1) == 0 and resolve_backend(backend, x.device) == "triton":
        return fp8_e4m3_quantize_triton(x)
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, _pow2_ceil(amax / E4M3_MAX), 1.0)  # a scalar: no ones tensor to fill
    scaled = (xf / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8), scale


def decode_e4m3(q: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes -> fp32 values, by bit arithmetic (0x7F/0xFF -> NaN, 0x80 -> -0.0)."""
    if q.dtype != torch.uint8:
        raise TypeError(f"decode_e4m3: expected uint8 bytes, got {q.dtype}")
    b = q.to(torch.int32)
    exp = (b >> 3) & 0xF
    mant = b & 0x7
    normal = (((exp + 120) << 23) | (mant << 20)).view(torch.float32)
    value = torch.where(exp == 0, mant.float() * 2.0**-9, normal)
    value = torch.where((b & 0x7F) == 0x7F, torch.full_like(value, float("nan")), value)
    return torch.where((b & 0x80) != 0, -value, value)


def fp8_e4m3_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """uint8[..., D] with fp32 scale[...] -> fp32[..., D]."""
    return decode_e4m3(q) * scale.float().unsqueeze(-1)


# ---------------------------------------------------------------- MXFP4


@functools.cache
def _e2m1_midpoints(device: torch.device) -> torch.Tensor:
    """Made once per device: a host-to-device copy cannot run inside a CUDA-graph capture."""
    return torch.tensor(_E2M1_MIDPOINTS, device=device)


def _e2m1_codes(a: torch.Tensor) -> torch.Tensor:
    """Magnitudes (already clamped to 6) -> 3-bit e2m1 codes, round to nearest, ties to even code."""
    mids = _e2m1_midpoints(a.device)
    code = torch.bucketize(a, mids)  # ties land on the lower code
    at_tie = (code < len(_E2M1_MIDPOINTS)) & (a == mids[code.clamp(max=len(_E2M1_MIDPOINTS) - 1)])
    return torch.where(at_tie & (code % 2 == 1), code + 1, code)


def mxfp4_quantize(x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """x[..., D] -> uint8[..., D/2 + D/32]: e2m1 nibbles, then one ue8m0 scale byte per 32 values.

    backend "triton" (the default on a GPU) runs kernels/quant_kernels.py's single kernel, with
    the same bytes; "torch" is the reference below."""
    d = x.shape[-1]
    if d % MX_BLOCK:
        raise ValueError(f"mxfp4_quantize: last dim {d} is not a multiple of {MX_BLOCK}")
    if resolve_backend(backend, x.device) == "triton":
        return mxfp4_quantize_triton(x)
    xb = x.float().reshape(*x.shape[:-1], d // MX_BLOCK, MX_BLOCK)
    amax = xb.abs().amax(dim=-1)
    _, e = torch.frexp(amax)
    # OCP MX: shared exponent floor(log2 amax) - emax(e2m1) = (e - 1) - 2
    shared = torch.where(amax > 0, e - 3, torch.full_like(e, -126)).clamp(-126, 127)
    scaled = xb / torch.ldexp(torch.ones_like(amax), shared).unsqueeze(-1)
    code = _e2m1_codes(scaled.abs().clamp(max=E2M1_MAX))
    nib = (code | (torch.signbit(scaled).to(code.dtype) << 3)).reshape(*x.shape[:-1], d)
    packed = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)
    return torch.cat([packed, (shared + 127).to(torch.uint8)], dim=-1)


def decode_e2m1(nib: torch.Tensor) -> torch.Tensor:
    """4-bit codes (int tensor) -> fp32 values, by bit arithmetic."""
    n = nib.to(torch.int32)
    exp = (n >> 1) & 0x3
    mant = (n & 1).float()
    value = torch.where(exp == 0, mant * 0.5, (2.0 + mant) * torch.ldexp(torch.ones_like(mant), exp - 2))
    return torch.where((n & 0x8) != 0, -value, value)


def decode_ue8m0(b: torch.Tensor) -> torch.Tensor:
    """ue8m0 scale bytes -> fp32 2^(b-127) (0x00 -> 0, 0xFF -> NaN), by bit arithmetic."""
    bits = b.to(torch.int32)
    value = (bits << 23).view(torch.float32)
    return torch.where(bits == 0xFF, torch.full_like(value, float("nan")), value)


def mxfp4_packed_bytes(d: int) -> int:
    """Bytes of d values packed as MXFP4 (mxfp4_quantize): d/2 of e2m1 nibbles, then d/32 ue8m0 scales."""
    return d // 2 + d // MX_BLOCK


def mxfp4_dequantize(packed: torch.Tensor, d: int) -> torch.Tensor:
    """uint8[..., D/2 + D/32] -> fp32[..., D]."""
    if packed.dtype != torch.uint8 or d % MX_BLOCK or packed.shape[-1] != mxfp4_packed_bytes(d):
        raise ValueError(
            f"mxfp4_dequantize: expected uint8[..., {mxfp4_packed_bytes(d)}] for d={d} (a multiple of {MX_BLOCK}), "
            f"got {packed.dtype}{list(packed.shape)}"
        )
    nibbles = packed[..., : d // 2].to(torch.int32)
    codes = torch.stack([nibbles & 0xF, nibbles >> 4], dim=-1).reshape(*packed.shape[:-1], d)
    scale = decode_ue8m0(packed[..., d // 2 :])
    values = decode_e2m1(codes).reshape(*packed.shape[:-1], d // MX_BLOCK, MX_BLOCK)
    return (values * scale.unsqueeze(-1)).reshape(*packed.shape[:-1], d)


# ---------------------------------------------------------------- cache rows


def _check_cache(cache: torch.Tensor, dtype: torch.dtype, width: int, name: str) -> None:
    if cache.dtype != dtype or cache.dim() != 2 or cache.shape[1] != width:
        raise ValueError(f"{name}: expected {dtype}[num_slots, {width}], got {cache.dtype}{list(cache.shape)}")


def check_slot_range(slots: torch.Tensor, num_slots: int, name: str) -> None:
    """ValueError unless every slot lies in [0, num_slots); reads the values (see values_checkable)."""
    if not slots.numel():
        return
    lo, hi = torch.aminmax(slots)  # one op: the runner checks every step's slots
    if int(lo) < 0 or int(hi) >= num_slots:
        raise ValueError(f"{name}: slots out of range [0, {num_slots})")


def _check_slots(slots: torch.Tensor, n: int, num_slots: int, name: str) -> torch.Tensor:
    if slots.dim() != 1 or slots.shape[0] != n:
        raise ValueError(f"{name}: slots must be 1-D with {n} entries, got shape {list(slots.shape)}")
    # On a GPU the range check would cost two host syncs per write (per layer, per step): the
    # caller checks its host copy of the slots instead.
    if values_checkable(slots):
        check_slot_range(slots, num_slots, name)
    return slots.long()


def encode_kv_rows(c: torch.Tensor, k_pe: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """[N, d_c], [N, d_r] -> the N cache rows in kv_dtype's layout."""
    _check_choice(kv_dtype, KV_DTYPES, "kv_dtype")
    if kv_dtype == "bf16":
        return torch.cat([c, k_pe], dim=-1).to(torch.bfloat16)
    n, d_c = c.shape
    kv_row_bytes(d_c, k_pe.shape[1], kv_dtype)  # validates d_c
    q, scale = fp8_e4m3_quantize(c.float().reshape(n, d_c // DS_MLA_GROUP, DS_MLA_GROUP))
    rope = k_pe.to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([q.reshape(n, d_c), scale.contiguous().view(torch.uint8).reshape(n, -1), rope], dim=-1)


def write_kv_cache(
    kv_cache: torch.Tensor, slots: torch.Tensor, c: torch.Tensor, k_pe: torch.Tensor, kv_dtype: str
) -> None:
    """Write the latent rows [c ; k_pe] of N tokens at the given global slots."""
    if c.dim() != 2 or k_pe.dim() != 2 or c.shape[0] != k_pe.shape[0]:
        raise ValueError(f"write_kv_cache: c [N, d_c] and k_pe [N, d_r] expected, "
                         f"got {list(c.shape)}, {list(k_pe.shape)}")
    d_c, d_r = c.shape[1], k_pe.shape[1]
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    _check_cache(kv_cache, dtype, kv_row_width(d_c, d_r, kv_dtype), "write_kv_cache: kv_cache")
    idx = _check_slots(slots, c.shape[0], kv_cache.shape[0], "write_kv_cache")
    kv_cache[idx] = encode_kv_rows(c, k_pe, kv_dtype).to(kv_cache.device)


def read_kv_rows(kv_cache: torch.Tensor, slots: torch.Tensor, d_c: int, d_r: int, kv_dtype: str) -> torch.Tensor:
    """Dequantised rows fp32[N, d_c + d_r] at the given slots (any shape of slots; rows gain its dims)."""
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    _check_cache(kv_cache, dtype, kv_row_width(d_c, d_r, kv_dtype), "read_kv_rows: kv_cache")
    rows = kv_cache[slots.long()]
    if kv_dtype == "bf16":
        return rows.float()
    groups = d_c // DS_MLA_GROUP
    lead = rows.shape[:-1]
    q = rows[..., :d_c].reshape(*lead, groups, DS_MLA_GROUP)
    scale = rows[..., d_c : d_c + 4 * groups].contiguous().view(torch.float32)
    rope = rows[..., d_c + 4 * groups :].contiguous().view(torch.bfloat16).float()
    return torch.cat([fp8_e4m3_dequantize(q, scale).reshape(*lead, d_c), rope], dim=-1)


# ---------------------------------------------------------------- indexer key cache
#
# One uint8 tensor per layer, [num_blocks, block_size * row bytes]: a cache block holds its
# block_size keys' values (block_size x indexer_value_bytes, key by key), then their block_size
# scale words. Slots are block * block_size + offset as in the KV cache. Values of consecutive keys
# of a block are one contiguous [block_size, value bytes] array, which a kernel loads as one block
# (a tensor descriptor: kernels/indexer_decode.py). A cache of block_size 1 is keys as rows, each
# [values ; scale word] (encode_indexer_keys' layout, the ragged keys of indexer_logits_ragged).


def encode_indexer_keys(keys: torch.Tensor, key_dtype: str) -> torch.Tensor:
    """keys [N, d_I] -> N indexer key rows uint8[N, indexer_row_bytes]: values, then the scale word."""
    _check_choice(key_dtype, KEY_DTYPES, "key_dtype")
    if key_dtype == "mxfp4":
        packed = mxfp4_quantize(keys)
        return torch.nn.functional.pad(packed, (0, indexer_row_bytes(keys.shape[-1], key_dtype) - packed.shape[-1]))
    q, scale = fp8_e4m3_quantize(keys)
    return torch.cat([q, scale.contiguous().view(torch.uint8).reshape(-1, 4)], dim=-1)


def indexer_cache_block_size(idx_cache: torch.Tensor, d_i: int, key_dtype: str, name: str) -> int:
    """Keys per block of an indexer key cache uint8[num_blocks, block_size * indexer_row_bytes]."""
    row = indexer_row_bytes(d_i, key_dtype)
    if (idx_cache.dtype != torch.uint8 or idx_cache.dim() != 2 or not idx_cache.shape[1]
            or idx_cache.shape[1] % row or not idx_cache.is_contiguous()):
        raise ValueError(f"{name}: expected a contiguous uint8[num_blocks, block_size * {row}] for d_I={d_i} "
                         f"{key_dtype} keys, got {idx_cache.dtype}{list(idx_cache.shape)}")
    return idx_cache.shape[1] // row


def _key_byte_addresses(slots: torch.Tensor, block_size: int, d_i: int, key_dtype: str) -> torch.Tensor:
    """int64[..., row bytes]: where in the flattened cache each byte of each slot's row lies."""
    value_bytes = indexer_value_bytes(d_i, key_dtype)
    slots = slots.long()
    block, offset = slots // block_size, slots % block_size
    base = block * (block_size * (value_bytes + INDEXER_SCALE_BYTES))
    values = base + offset * value_bytes
    scale = base + block_size * value_bytes + offset * INDEXER_SCALE_BYTES
    col = torch.arange(value_bytes + INDEXER_SCALE_BYTES, device=slots.device)
    return torch.where(col < value_bytes, values[..., None] + col, scale[..., None] + (col - value_bytes))


def write_indexer_cache(idx_cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, key_dtype: str) -> None:
    """Quantise and write N indexer keys [N, d_I] at the given global slots."""
    if keys.dim() != 2:
        raise ValueError(f"write_indexer_cache: keys must be [N, d_I], got {list(keys.shape)}")
    block_size = indexer_cache_block_size(idx_cache, keys.shape[1], key_dtype, "write_indexer_cache: idx_cache")
    idx = _check_slots(slots, keys.shape[0], idx_cache.shape[0] * block_size, "write_indexer_cache")
    addresses = _key_byte_addresses(idx.to(idx_cache.device), block_size, keys.shape[1], key_dtype)
    idx_cache.view(-1)[addresses] = encode_indexer_keys(keys, key_dtype).to(idx_cache.device)


def gather_indexer_rows(idx_cache: torch.Tensor, slots: torch.Tensor, d_i: int, key_dtype: str) -> torch.Tensor:
    """The keys at slots (any shape) as rows uint8[..., indexer_row_bytes] (encode_indexer_keys' layout)."""
    block_size = indexer_cache_block_size(idx_cache, d_i, key_dtype, "gather_indexer_rows: idx_cache")
    return idx_cache.view(-1)[_key_byte_addresses(slots, block_size, d_i, key_dtype)]


def read_indexer_keys(rows: torch.Tensor, d_i: int, key_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer rows uint8[..., row] -> (values fp32[..., d_I], per-key scale fp32[...]).

    fp8 keeps its per-key scale apart (the logit applies it after the ReLU); MXFP4's per-32 scales
    are inside the values and the per-key scale is 1.
    """
    if rows.dtype != torch.uint8 or rows.shape[-1] != indexer_row_bytes(d_i, key_dtype):
        raise ValueError(
            f"indexer key rows: expected uint8[..., {indexer_row_bytes(d_i, key_dtype)}] for d_I={d_i} "
            f"{key_dtype}, got {rows.dtype}{list(rows.shape)}"
        )
    if key_dtype == "mxfp4":
        values = mxfp4_dequantize(rows[..., : mxfp4_packed_bytes(d_i)], d_i)
        return values, torch.ones(rows.shape[:-1], device=rows.device)
    return decode_e4m3(rows[..., :d_i]), rows[..., d_i:].contiguous().view(torch.float32).squeeze(-1)
