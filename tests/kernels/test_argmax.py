"""The greedy sampler's argmax (kernels/argmax.py) against torch.argmax, in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

import kernels.backend
from kernels.argmax import BLOCK, argmax_rows


def check(logits: torch.Tensor) -> None:
    got = argmax_rows(logits, backend="triton")
    assert got.dtype == torch.int64
    assert got.tolist() == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("cols", (1, 7, 1000, BLOCK + 300))  # one lane, a masked tail, several blocks a row
def test_random_rows(gen, cols):
    check(torch.randn(5, cols, generator=gen))


def test_ties_take_the_first_column(gen):
    logits = torch.randint(0, 3, (6, 2 * BLOCK + 5), generator=gen).float()  # many columns share the max
    logits[1, :] = 1.0  # a whole row tied
    logits[2, -1] = 9.0  # the max in the last column, past two blocks
    logits[3, BLOCK] = 9.0  # the first column of the second block ...
    logits[3, 2 * BLOCK] = 9.0  # ... tied by a later lane-mate
    check(logits)


def test_nan_and_inf(gen):
    logits = torch.randn(5, 300, generator=gen)
    logits[0, 17] = float("nan")  # NaN beats +inf, the first NaN wins
    logits[0, 5] = float("inf")
    logits[0, 200] = float("nan")
    logits[1, :] = float("-inf")  # a row of -inf: column 0
    logits[2, 40] = -float("nan")  # a NaN with its sign bit set is still NaN
    logits[3, 7] = float("inf")
    logits[3, 9] = float("inf")
    check(logits)


def test_strided_rows_and_empty_batch(gen):
    wide = torch.randn(4, 600, generator=gen)
    check(wide[:, 50:350])  # rows with a stride of their own
    check(wide[:, ::2])  # not unit column stride: copied first
    assert argmax_rows(torch.empty(0, 10), backend="triton").shape == (0,)


def test_written_into_a_given_buffer(gen):
    """A decode graph writes its tokens into the front of the buffer the next step reads."""
    logits = torch.randn(3, 1000, generator=gen)
    buffer = torch.full((5,), -1, dtype=torch.long)
    assert argmax_rows(logits, backend="triton", out=buffer[:3]).data_ptr() == buffer.data_ptr()
    assert buffer.tolist() == logits.argmax(dim=-1).tolist() + [-1, -1]
    argmax_rows(logits.flip(1), backend="torch", out=buffer[2:])
    assert buffer[2:].tolist() == logits.flip(1).argmax(dim=-1).tolist()


def test_mirrored_into_the_buffer_row_the_index_names(gen):
    """A decode graph's tokens also land in the host buffer that the step's inputs name."""
    logits = torch.randn(3, 1000, generator=gen)
    buffers = torch.full((2, 5), -1, dtype=torch.long)
    out = argmax_rows(logits, backend="triton", mirror=(buffers, torch.tensor([1])))
    assert buffers.tolist() == [[-1] * 5, out.tolist() + [-1, -1]]
    assert out.tolist() == logits.argmax(dim=-1).tolist()
    for index, row in ((7, 1), (-3, 0)):  # a stale index stays inside the buffers
        buffers.fill_(-1)
        argmax_rows(logits, backend="triton", mirror=(buffers, torch.tensor([index])))
        assert buffers[row, :3].tolist() == out.tolist() and (buffers[1 - row] == -1).all()


def test_bad_input_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="fp32"):
        argmax_rows(torch.zeros(2, 3, dtype=torch.bfloat16), backend="triton")
    with pytest.raises(ValueError, match=r"\[T, V\]"):
        argmax_rows(torch.zeros(3), backend="triton")
    with pytest.raises(ValueError, match=r"out must be contiguous int64 \[2\]"):
        argmax_rows(torch.zeros(2, 3), backend="triton", out=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="out must be"):
        argmax_rows(torch.zeros(2, 3), backend="triton", out=torch.zeros(2, dtype=torch.int32))
    index = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"mirror must be int64 buffers \[R, >= 2\]"):
        argmax_rows(torch.zeros(2, 3), backend="triton", mirror=(torch.zeros(2, 1, dtype=torch.long), index))
    with pytest.raises(ValueError, match="on the triton backend;.* backend torch$"):
        argmax_rows(torch.zeros(2, 3), backend="torch", mirror=(torch.zeros(2, 2, dtype=torch.long), index))
    monkeypatch.setattr(kernels.backend, "_default", "torch")  # the process default, as set_backend sets it
    with pytest.raises(ValueError, match="backend torch$"):  # the backend it resolved to, not None
        argmax_rows(torch.zeros(2, 3), mirror=(torch.zeros(2, 2, dtype=torch.long), index))
