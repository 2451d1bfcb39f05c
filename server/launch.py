"""How this process was launched, as a benchmark's results record it: its command line without
secrets, the environment variables that shape a benchmark, its working directory and the versions
of the packages it runs on.

Our server reports it on its /v1/models card (`launch`, server/api.py) and loadgen records its own
(loadgen/run/provenance.py), so every result can say how both sides were started. Standard library
only: loadgen imports it without the server's dependencies.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

SECRET_FLAGS = ("--api-key", "--header")  # their values are replaced by "***"
HIDDEN = "***"
# Variables that change what a benchmark measures: the GPUs and collectives used, kernel and
# compiler choices, thread counts, and the settings of loadgen, our server, vLLM and SGLang.
BENCHMARK_ENV_PREFIXES = ("AGENTLOAD_", "CUDA_", "NCCL_", "NVSHMEM_", "TORCH", "PYTORCH_", "TRITON_", "OMP_",
                          "MKL_", "VLLM_", "SGLANG_", "HIP_", "ROCR_", "HSA_")
BENCHMARK_ENV_NAMES = ("PYTHONHASHSEED", "LD_PRELOAD", "TOKENIZERS_PARALLELISM")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")  # never recorded, whatever the prefix
PACKAGES = ("agentload", "torch", "triton", "numpy", "aiohttp", "orjson", "safetensors", "httptools", "uvloop",
            "hdrhistogram")


def redacted(argv: list[str]) -> list[str]:
    """The command line without secrets: the values of --api-key and --header become '***'."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif arg.startswith(tuple(flag + "=" for flag in SECRET_FLAGS)):
            out.append(arg.partition("=")[0] + "=" + HIDDEN)
        else:
            out.append(arg)
    return out


def shapes_benchmark(name: str) -> bool:
    """Whether an environment variable is one a launch records (module constants); never a secret."""
    if any(word in name.upper() for word in SECRET_WORDS):
        return False
    return name in BENCHMARK_ENV_NAMES or name.startswith(BENCHMARK_ENV_PREFIXES)


def benchmark_env() -> dict[str, str]:
    """This process's environment variables that shape a benchmark, by name."""
    return {name: value for name, value in sorted(os.environ.items()) if shapes_benchmark(name)}


def versions() -> dict[str, Any]:
    """{"python": version, "packages": {name: version}} of the PACKAGES installed in this interpreter."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "packages": found}


def process_launch() -> dict[str, Any]:
    """{"argv", "env", "cwd", "versions"} of this process: the interpreter's whole command line
    (sys.orig_argv) without secrets, benchmark_env(), the working directory, versions()."""
    return {"argv": redacted(list(sys.orig_argv)), "env": benchmark_env(), "cwd": os.getcwd(), "versions": versions()}
