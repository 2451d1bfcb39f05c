"""benchmarks/determinism.py's comparison: a run's calls against the reference run's, bit for bit."""

from __future__ import annotations

import pytest
import torch

from benchmarks.determinism import Recorder, differing, first_steps, repeat_alone, rows_owner


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
