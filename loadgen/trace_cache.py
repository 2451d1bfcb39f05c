"""A cache of parsed bundled trace sets, so a replay reaches its first request quickly.

Parsing and validating the bundled agentic-coding sessions takes about a second (every hash id
is checked); their pickled form loads in a fraction of that. Only sets shipped inside the
traces package are cached, keyed by their files and the package's own source files (size and
mtime), so a new or edited trace file, or a new reader, never meets a stale entry. Any problem
with the cache (unwritable folder, unreadable entry) falls back to parsing.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path

import traces
from traces import TraceSet, bundled_sets, load_traces


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentload" / "traces"


def load_traces_cached(source: str, fmt: str) -> TraceSet:
    """`traces.load_traces(source, fmt)`, through the cache when `source` names a bundled set."""
    if Path(source).exists() or source not in bundled_sets():
        return load_traces(source, fmt)
    path = cache_dir() / f"{source}-{fmt}-{_fingerprint(source)}.pickle"
    try:
        with open(path, "rb") as handle:
            cached = pickle.load(handle)
        if isinstance(cached, TraceSet):
            return cached
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass
    loaded = load_traces(source, fmt)
    _store(path, loaded)
    return loaded


def _fingerprint(name: str) -> str:
    package = Path(traces.__file__).parent
    files = sorted((package / "data" / name).iterdir()) + sorted(package.glob("*.py"))
    digest = hashlib.sha256(sys.version.encode())
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def _store(path: Path, value: TraceSet) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as handle:
            pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, path)
    except OSError:
        pass  # a read-only home: parse every time
