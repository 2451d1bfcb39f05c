"""The `server` extra: the packages `pip install agentload` leaves out (pyproject.toml), which the
engine and its HTTP server import, and the one line that names the extra when one is missing.

Kept free of imports: `server start` and `loadgen bench` come here where the import failed.
"""

from __future__ import annotations

import sys

SERVER_EXTRA = ("torch", "triton", "aiohttp", "safetensors")
INSTALL_SERVER_EXTRA = "pip install 'agentload[server]'"
EXIT_MISSING_EXTRA = 2


def exit_missing_extra(exc: ModuleNotFoundError, command: str) -> int:
    """When `exc` is a package of the server extra that is not installed, say on one stderr line
    what to install and return the exit code; re-raise it when the missing module is any other."""
    package = (exc.name or "").partition(".")[0]
    if package not in SERVER_EXTRA:
        raise exc
    print(f"{command}: error: {package} is not installed; it comes with the server extra: "
          f"{INSTALL_SERVER_EXTRA}", file=sys.stderr)
    return EXIT_MISSING_EXTRA
