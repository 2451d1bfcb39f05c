"""Kernel tests run the Triton kernels on CPU tensors through the interpreter, with poisoned outputs."""

from __future__ import annotations

import os
import zlib

# Must happen before anything imports triton: the interpreter is chosen when kernels are decorated.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.triton_utils import poisoned_outputs  # noqa: E402
from tests.torch_threads import one_torch_thread  # noqa: E402, F401  (autouse)


@pytest.fixture(autouse=True)
def _poison_kernel_outputs():
    """Every Triton launch in these tests starts from NaN / -7777 outputs, so unwritten elements show."""
    with poisoned_outputs():
        yield


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded from the test id: each check draws fresh inputs, runs stay reproducible."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g
