"""One torch thread for the tests that run the model in the pytest process.

Their batches are tiny (the tiny model, kernel checks of a few hundred rows): a second OpenMP
thread only adds spin and hand-off, and on a 2-core machine shared with server subprocesses it
makes these tests 3-4x slower (measured: test_engine's preemption + tiny-pool tests 7.4 s on one
thread against 29.8 s on two). The conftests of tests/server and tests/kernels import the fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
