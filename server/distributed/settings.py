"""Process-wide switches every tensor-parallel rank applies: NCCL multicast off, the step timeout."""

from __future__ import annotations

import os

# NVLink multicast (NVLS) can hang or fail the group's start on hosts that offer it without being
# able to use it, and these all-reduces do not need it: every rank keeps it off (setdefault: an
# explicit setting in the environment wins).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
STEP_TIMEOUT_ENV = "AGENTLOAD_TP_STEP_TIMEOUT_S"
DEFAULT_STEP_TIMEOUT_S = 120.0
# A rank's start (torch's import, the model built) on a busy host takes longer than a short step
# timeout: the rendezvous waits at least this long for the other ranks.
MIN_RENDEZVOUS_S = 30.0


def disable_multicast() -> None:
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)


def step_timeout_s() -> float:
    """How long a step may take before the watchdog declares a rank hung (AGENTLOAD_TP_STEP_TIMEOUT_S)."""
    raw = os.environ.get(STEP_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_STEP_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{STEP_TIMEOUT_ENV}: must be a positive number of seconds, got {raw!r}")
    return value


def collective_timeout_s(step_s: float) -> float:
    """The rendezvous's and the collectives' own timeout: twice the step timeout (the watchdog,
    which names the rank, fires first), and never under MIN_RENDEZVOUS_S."""
    return max(2 * step_s, MIN_RENDEZVOUS_S)
