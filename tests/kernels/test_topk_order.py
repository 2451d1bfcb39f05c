"""Top-k outputs that do not depend on the order in which a GPU's programs run: the compacting
path places columns through atomic counters (whose order varies from run to run), so it sorts
each row, and it takes ties at the k-th largest value by lowest column, as the one-launch paths do.

In the interpreter a row's programs run one after another; with two programs per row, program 0
takes chunks 0 and 2 and program 1 chunk 1, so the columns reach the counters out of column
order, as they may on a GPU."""

from __future__ import annotations

import pytest
import torch

from kernels.topk import topk_triton
from tests.kernels.test_topk import CPU_CONFIG, PATHS

# test_topk's paths: the multi-launch ones (compacting and sampled), and the one-launch one
COMPACTING = {name: cfg for name, cfg in PATHS.items() if not cfg.single_pass_max_cols}
ONE_LAUNCH = {name: cfg for name, cfg in PATHS.items() if cfg.single_pass_max_cols}


@pytest.mark.parametrize("path", COMPACTING)
def test_compacting_rows_come_out_sorted(gen, path):
    """Every row longer than k lists its columns in ascending order (short rows: 0..len-1, -1)."""
    n, k = 700, 48
    logits = torch.randn(4, n, generator=gen)
    lengths = torch.tensor([n, n - 37, k + 1, 20], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, COMPACTING[path])
    for t in range(3):
        row = got[t]
        assert torch.equal(row, row.sort().values), f"row {t} is not in ascending column order"
        expect = logits[t, : int(lengths[t])].topk(k).indices.sort().values.int()
        assert torch.equal(row, expect)
    assert torch.equal(got[3], torch.cat((torch.arange(20), torch.full((k - 20,), -1))).int())


@pytest.mark.parametrize("path", [*COMPACTING, *ONE_LAUNCH])
def test_ties_at_the_kth_value_take_the_lowest_columns(gen, path):
    """18 equal values straddle the k-th largest, 6 in each of the split's three chunks; the top k
    takes the 12 of the lowest columns, whichever program's chunk reached the list first."""
    n = 700
    chunk = CPU_CONFIG.chunk
    assert n > 2 * chunk  # three chunks: columns [0, 256), [256, 512), [512, 700)
    logits = -10.0 - torch.rand(2, n, generator=gen)
    above = torch.randperm(n, generator=gen)[:16]
    logits[:, above] = 5.0
    free = [c for c in range(n) if c not in set(above.tolist())]
    ties = [c for lo in (0, chunk, 2 * chunk) for c in [f for f in free if f >= lo][:6]]
    logits[:, ties] = 2.0
    k = 16 + 12
    lengths = torch.tensor([n, n], dtype=torch.int32)
    got = topk_triton(logits, lengths, k, {**COMPACTING, **ONE_LAUNCH}[path])
    expect = torch.cat((above, torch.tensor(ties[:12]))).sort().values.int()
    for t in range(2):
        assert torch.equal(got[t].sort().values, expect), f"row {t} took other tied columns"
