"""benchmarks/kernels.py's helpers (its work models, timing and the GPU's ceilings) for the scripts that
reuse them. Its file name is the kernels package's, so it is loaded by path under another name;
loading it puts the repository root on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "kernels_benchmark"


def kernels_benchmark() -> ModuleType:
    """benchmarks/kernels.py as the module `kernels_benchmark`, loaded once."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(NAME, Path(__file__).resolve().parent / "kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
