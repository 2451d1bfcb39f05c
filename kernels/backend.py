"""Process-wide choice between the Triton kernels, their torch references, and "gluon": the Gluon
kernel where an op has one (sparse MLA on sm_90 (Hopper) or gfx942 (CDNA3, never tested on AMD
hardware), kernels/sparse_mla_gluon.py), Triton for the rest."""

from __future__ import annotations

import os

import torch

BACKENDS = ("triton", "torch", "gluon")
ENV_VAR = "AGENTLOAD_KERNEL_BACKEND"

_default: str | None = None


def _check(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}: unknown kernel backend {name!r}; expected one of {BACKENDS}")
    return name


def runs_compiled_kernels(name: str) -> bool:
    """Whether backend `name` runs compiled kernels (all but the torch references): on a GPU each
    compiles on first use, and a CUDA graph can capture their launches."""
    return _check(name, "backend") != "torch"


def get_backend() -> str:
    """The default backend: set_backend's choice, else $AGENTLOAD_KERNEL_BACKEND, else triton on CUDA, torch on CPU."""
    if _default is not None:
        return _default
    env = os.environ.get(ENV_VAR)
    if env:
        return _check(env, f"${ENV_VAR}")
    return "triton" if torch.cuda.is_available() else "torch"


def set_backend(name: str | None) -> None:
    """Change the process default; None goes back to the environment/auto choice."""
    global _default
    _default = None if name is None else _check(name, "set_backend")


def values_checkable(t: torch.Tensor) -> bool:
    """Whether a check may read t's values: free for CPU tensors, but on a GPU every read (a
    min, a max, int(t)) makes the host wait for the device. So range checks run on CPU tensors
    only, and a GPU caller checks the host data it built the tensor from (the engine's
    ModelRunner checks each step's slots once, before the copy to the device)."""
    return t.device.type == "cpu"


def resolve_backend(backend: str | None, device: torch.device, gluon_kernel: bool = False) -> str:
    """The backend one call uses; refuses Triton on CPU tensors unless the interpreter is on.

    "gluon" stays "gluon" for an op with a Gluon kernel (gluon_kernel) and means "triton" for the rest."""
    name = get_backend() if backend is None else _check(backend, "backend")
    if name == "gluon" and not gluon_kernel:
        name = "triton"
    if name == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "backend='triton' got CPU tensors: set TRITON_INTERPRET=1 before importing triton "
            "(or use backend='torch')"
        )
    return name
