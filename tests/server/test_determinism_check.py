"""benchmarks/determinism.py's comparison: a run's calls against the reference run's, bit for bit."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks.determinism import OUTPUTS, Recorder, differing, first_steps, main, repeat_alone, rows_owner
from kernels.quant import encode_indexer_keys, indexer_row_bytes, write_indexer_cache


def test_differing_compares_bits_and_names_rows():
    a = torch.tensor([[1.0, 2.0], [3.0, float("nan")], [-0.0, 5.0]])
    assert differing(a, a.clone()) is None  # NaN equals itself bit for bit
    b = a.clone()
    b[2, 0] = 0.0  # -0.0 and 0.0 compare equal as floats, not as bits
    b[0, 1] = 2.5
    assert differing(b, a) == ([0, 2], 2, 0.5)
    assert differing(a.int(), a.int()) is None
    assert differing(a[:2], a)[0] == [0, 1]  # a shape change marks every row


def test_recorder_reports_the_first_differing_call():
    def topk_args(logits):
        return (logits, torch.tensor([4, 4]), 2, torch.zeros(2, 1, dtype=torch.int32), torch.tensor([0, 1]), 64)

    logits = torch.randn(2, 4)
    slots = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    reference = Recorder()
    reference.start_step([("r0", 1), ("r1", 1)])
    reference.record("topk_slots", topk_args(logits), {}, slots)
    reference.record("linear", (logits, logits), {}, logits @ logits.T)

    run = Recorder(reference=reference.calls)
    run.start_step([("r0", 1), ("r1", 1)])
    run.record("topk_slots", topk_args(logits), {}, slots[:, [1, 0]])  # row 0's order changed; row 1 too
    run.record("linear", (logits, logits), {}, logits @ logits.T)
    [order] = run.differences  # the sorted slots (output 1) are the same set: no second difference
    assert (order.call.name, order.call.step, order.output, order.rows) == ("topk_slots", 0, 0, [0, 1])
    assert rows_owner(run.batches[0], order.rows, 2) == ["r0", "r1"]
    assert first_steps(run) == {"r0": 0, "r1": 0}
    assert "not repeated" not in repeat_alone(order, 2)  # its inputs were kept: it runs again

    other = Recorder(reference=reference.calls)
    other.start_step([("r0", 1), ("r1", 1)])
    with pytest.raises(RuntimeError, match="schedules differ"):
        other.record("linear", (logits, logits), {}, logits)


@pytest.mark.parametrize("key_dtype", ["fp8", "mxfp4"])
def test_indexer_prepare_records_the_keys_written_to_the_block_laid_cache(key_dtype):
    """The indexer key cache is laid out per block (kernels/quant.py), so the keys indexer_prepare
    wrote are read back at their slots through the layout, not as rows of the cache tensor."""
    d_i, block_size, num_blocks = 64, 16, 3
    cache = torch.zeros(num_blocks, block_size * indexer_row_bytes(d_i, key_dtype), dtype=torch.uint8)
    slots = torch.tensor([40, 3, 17])  # past num_blocks: not rows of the tensor
    keys = torch.randn(3, d_i, generator=torch.Generator().manual_seed(0))
    write_indexer_cache(cache, slots, keys, key_dtype)
    args = (None, keys, None, None, None, 1e-6, None, None, 0, cache, slots, key_dtype, 1.0)
    q8, weights = torch.zeros(3, 1, d_i, dtype=torch.uint8), torch.zeros(3, 1)
    recorded = OUTPUTS["indexer_prepare"](args, (q8, weights))
    assert recorded[0] is q8 and recorded[1] is weights
    assert torch.equal(recorded[2], encode_indexer_keys(keys, key_dtype))


def test_smoke_runs_end_to_end(capsys):
    """The script's CPU smoke (tiny model, torch kernels): two runs recorded and compared call by call."""
    assert main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^run 1: [1-9]\d* kernel calls recorded over [1-9]\d* steps$", out, re.MULTILINE), out
    assert "run 2: greedy tokens IDENTICAL to run 1; 0 recorded outputs differ bitwise" in out
