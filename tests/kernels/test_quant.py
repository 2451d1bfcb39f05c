"""fp8 e4m3 / MXFP4 encode and decode, known bit patterns, cache row layouts and writers."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.quant import (
    decode_e2m1,
    decode_e4m3,
    decode_ue8m0,
    encode_indexer_keys,
    fp8_e4m3_dequantize,
    fp8_e4m3_quantize,
    gather_indexer_rows,
    indexer_row_bytes,
    kv_row_bytes,
    mxfp4_dequantize,
    mxfp4_quantize,
    read_indexer_keys,
    read_kv_rows,
    write_indexer_cache,
    write_kv_cache,
)


def _bytes(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def test_e4m3_known_bit_patterns():
    got = decode_e4m3(_bytes(0x7E, 0xFE, 0x01, 0x07, 0x08, 0x38, 0x00, 0x40, 0x3C))
    assert got.tolist() == [448.0, -448.0, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 1.0, 0.0, 2.0, 1.5]
    neg_zero = decode_e4m3(_bytes(0x80))
    assert neg_zero.item() == 0.0 and torch.signbit(neg_zero).item()
    assert torch.isnan(decode_e4m3(_bytes(0x7F, 0xFF))).all()


def test_e4m3_decode_matches_torch_float8_on_all_bytes():
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ours = decode_e4m3(every)
    theirs = every.view(torch.float8_e4m3fn).float()
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    finite = ~torch.isnan(theirs)
    assert torch.equal(ours[finite], theirs[finite])
    assert torch.equal(torch.signbit(ours[finite]), torch.signbit(theirs[finite]))


def test_decode_rejects_non_uint8():
    with pytest.raises(TypeError, match="uint8"):
        decode_e4m3(torch.zeros(3, dtype=torch.int32))


def test_fp8_quantize_power_of_two_scale_and_round_trip(gen):
    x = torch.randn(64, 128, generator=gen) * torch.logspace(-3, 3, 64)[:, None]
    q, scale = fp8_e4m3_quantize(x)
    assert q.dtype == torch.uint8 and scale.shape == (64,)
    mant, _ = torch.frexp(scale)
    assert (mant == 0.5).all(), "scales must be powers of two"
    amax = x.abs().amax(dim=1)
    assert ((amax / scale <= 448) & (amax / scale > 224)).all(), "scale must be 2^ceil(log2(amax/448))"
    back = fp8_e4m3_dequantize(q, scale)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals, absolute 2^-10 * scale below
    tol = torch.maximum(x.abs() * 2.0**-4, scale[:, None] * 2.0**-10)
    assert ((back - x).abs() <= tol).all()
    assert not ((q == 0x7F) | (q == 0xFF)).any()


def test_fp8_quantize_exact_values_and_zero_rows():
    x = torch.tensor([[448.0, -1.0, 2.0**-9, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q, scale = fp8_e4m3_quantize(x)
    assert scale.tolist() == [1.0, 1.0]
    assert q[0].tolist() == [0x7E, 0xB8, 0x01, 0x00]
    assert q[1].tolist() == [0, 0, 0, 0]


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_and_ue8m0_known_values():
    assert decode_e2m1(torch.arange(8)).tolist() == E2M1
    assert decode_e2m1(torch.arange(8, 16)).tolist() == [-v for v in E2M1]
    assert torch.signbit(decode_e2m1(torch.tensor([8]))).item()
    scales = decode_ue8m0(_bytes(127, 128, 126, 1, 254, 0))
    assert scales.tolist() == [1.0, 2.0, 0.5, 2.0**-126, 2.0**127, 0.0]
    assert torch.isnan(decode_ue8m0(_bytes(0xFF))).all()


def test_mxfp4_exact_values_nibble_order_and_scale_byte():
    values = torch.tensor(E2M1 + [-v for v in E2M1] + E2M1 + [-v for v in E2M1])  # 32, amax 6 -> scale 1
    packed = mxfp4_quantize(values[None])
    assert packed.shape == (1, 17)
    assert packed[0, 16].item() == 127
    assert packed[0, 0].item() == 0x10  # element 0 (code 0) low nibble, element 1 (code 1) high nibble
    assert torch.equal(mxfp4_dequantize(packed, 32)[0], values)
    scaled = mxfp4_quantize(values[None] * 2.0**-5)
    assert scaled[0, 16].item() == 122
    assert torch.equal(mxfp4_dequantize(scaled, 32)[0], values * 2.0**-5)


def test_mxfp4_rounds_to_nearest_ties_to_even():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    x = torch.tensor((ties + [0.1, 0.7, 5.9, -2.6]) * 32)[:32]
    got = mxfp4_dequantize(mxfp4_quantize(x[None]), 32)[0]
    assert got[:8].tolist() == expect
    assert got[8:12].tolist() == [0.0, 0.5, 6.0, -3.0]


def test_mxfp4_round_trip_error_bound(gen):
    x = torch.randn(16, 128, generator=gen) * 10
    back = mxfp4_dequantize(mxfp4_quantize(x), 128)
    scale = 2.0 ** (torch.floor(torch.log2(x.reshape(16, 4, 32).abs().amax(-1))) - 2)
    # worst cases: half the 4..6 gap (1 step) or the clamp of (6, 8) to 6 (2 steps)
    assert ((back - x).reshape(16, 4, 32).abs() <= 2 * scale[..., None]).all()
    assert torch.equal(torch.sign(back[back != 0]), torch.sign(x[back != 0]))


def test_row_sizes_at_v32_shapes():
    assert kv_row_bytes(512, 64, "bf16") == 1152
    assert kv_row_bytes(512, 64, "fp8_ds_mla") == 656
    assert indexer_row_bytes(128, "fp8") == 132
    assert indexer_row_bytes(128, "mxfp4") == 68
    with pytest.raises(ValueError, match="kv_dtype"):
        kv_row_bytes(512, 64, "fp4")
    with pytest.raises(ValueError, match="multiple of 128"):
        kv_row_bytes(96, 64, "fp8_ds_mla")
    assert indexer_row_bytes(64, "mxfp4") == 36, "a whole scale word per key, two of its bytes used"
    with pytest.raises(ValueError, match="multiple of 32"):
        indexer_row_bytes(48, "mxfp4")
    with pytest.raises(ValueError, match="up to 128"):
        indexer_row_bytes(256, "mxfp4")


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_kv_cache_write_read(gen, kv_dtype):
    d_c, d_r, n = 256, 32, 10
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    width = d_c + d_r if kv_dtype == "bf16" else kv_row_bytes(d_c, d_r, kv_dtype)
    cache = torch.full((32, width), 0x5A, dtype=dtype)
    slots = torch.randperm(32, generator=gen)[:n]
    c, k_pe = torch.randn(n, d_c, generator=gen), torch.randn(n, d_r, generator=gen)
    write_kv_cache(cache, slots, c, k_pe, kv_dtype)
    rows = read_kv_rows(cache, slots, d_c, d_r, kv_dtype)
    assert rows.shape == (n, d_c + d_r)
    assert torch.equal(rows[:, d_c:], k_pe.bfloat16().float()), "rope part is stored as bf16"
    if kv_dtype == "bf16":
        assert torch.equal(rows[:, :d_c], c.bfloat16().float())
    else:
        groups = c.reshape(n, 2, 128)
        q, scale = fp8_e4m3_quantize(groups)
        assert torch.equal(rows[:, :d_c], fp8_e4m3_dequantize(q, scale).reshape(n, d_c))
        assert torch.equal(cache[slots, :d_c], q.reshape(n, d_c))
        assert torch.equal(cache[slots, d_c : d_c + 8].contiguous().view(torch.float32), scale)
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[slots] = False
    assert (cache[untouched] == 0x5A).all(), "rows at other slots must stay untouched"


def test_kv_cache_writer_errors():
    cache = torch.zeros(8, 160, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache"):
        write_kv_cache(cache, torch.arange(2), torch.randn(2, 128), torch.randn(2, 64), "bf16")
    with pytest.raises(ValueError, match="out of range"):
        write_kv_cache(cache, torch.tensor([0, 8]), torch.randn(2, 128), torch.randn(2, 32), "bf16")
    with pytest.raises(ValueError, match="slots"):
        write_kv_cache(cache, torch.arange(3), torch.randn(2, 128), torch.randn(2, 32), "bf16")


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
@pytest.mark.parametrize("block_size", [1, 4])
def test_indexer_cache_write_read(gen, key_dtype, block_size):
    d_i, n = 64, 12
    cache = torch.zeros(20 // block_size, block_size * indexer_row_bytes(d_i, key_dtype), dtype=torch.uint8)
    slots = torch.randperm(20, generator=gen)[:n]
    keys = torch.randn(n, d_i, generator=gen)
    write_indexer_cache(cache, slots, keys, key_dtype)
    values, scale = read_indexer_keys(gather_indexer_rows(cache, slots, d_i, key_dtype), d_i, key_dtype)
    if key_dtype == "fp8":
        q, s = fp8_e4m3_quantize(keys)
        assert torch.equal(values, decode_e4m3(q)) and torch.equal(scale, s)
    else:
        assert torch.equal(values, mxfp4_dequantize(mxfp4_quantize(keys), d_i)) and (scale == 1).all()
    rel = (values * scale[:, None] - keys).norm() / keys.norm()
    assert rel < (0.05 if key_dtype == "fp8" else 0.2)
    assert math.isfinite(float(rel))
    with pytest.raises(ValueError, match="idx_cache"):
        write_indexer_cache(cache[:, :-1], slots, keys, key_dtype)
    with pytest.raises(ValueError, match="out of range"):
        write_indexer_cache(cache, torch.tensor([20]), keys[:1], key_dtype)


@pytest.mark.parametrize(("key_dtype", "d_i"), [("fp8", 128), ("fp8", 64), ("mxfp4", 128), ("mxfp4", 64)])
def test_indexer_cache_block_layout(gen, key_dtype, d_i):
    """The bytes where the writer puts a key are the layout's, worked out here: in block b of
    block_size keys (a row of the cache), key o's values at o * value_bytes, its scale word at
    block_size * value_bytes + 4 o; the gather reads them back as encode_indexer_keys' rows."""
    block_size, num_blocks = 8, 3
    value_bytes = d_i if key_dtype == "fp8" else d_i // 2
    cache = torch.full((num_blocks, block_size * (value_bytes + 4)), 0xA5, dtype=torch.uint8)
    slots = torch.tensor([9, 0, 23, 15])
    keys = torch.randn(len(slots), d_i, generator=gen)
    write_indexer_cache(cache, slots, keys, key_dtype)
    rows = encode_indexer_keys(keys, key_dtype)
    assert rows.shape == (len(slots), value_bytes + 4)
    for row, slot in zip(rows, slots.tolist()):
        block, offset = divmod(slot, block_size)
        values = cache[block, offset * value_bytes : (offset + 1) * value_bytes]
        scale = cache[block, block_size * value_bytes + 4 * offset : block_size * value_bytes + 4 * offset + 4]
        assert torch.equal(values, row[:value_bytes]) and torch.equal(scale, row[value_bytes:])
    assert torch.equal(gather_indexer_rows(cache, slots, d_i, key_dtype), rows)
    assert (cache[1, : value_bytes] == 0xA5).all(), "slot 8 was not written"
    if key_dtype == "fp8":
        assert torch.equal(rows[:, d_i:].contiguous().view(torch.float32).squeeze(1), fp8_e4m3_quantize(keys)[1])
    else:
        packed = mxfp4_quantize(keys)
        assert torch.equal(rows[:, : d_i // 2 + d_i // 32], packed) and (rows[:, d_i // 2 + d_i // 32 :] == 0).all()
