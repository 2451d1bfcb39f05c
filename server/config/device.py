"""Where the engine runs: the device and kernel backend that 'auto' settles to."""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "gluon")


def resolve_device(device: str) -> str:
    """'auto' becomes 'cuda' when a GPU is visible, else 'cpu'."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(backend: str, device: str) -> str:
    if backend != "auto":
        return backend
    return "triton" if resolve_device(device) == "cuda" else "torch"

