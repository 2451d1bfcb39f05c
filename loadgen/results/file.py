"""The results file of one run: schema `agentload.result/1`, atomic write, read with validation.

Layout (a later `loadgen report|compare` reads it):

    {"schema": "agentload.result/1", "created": ISO-8601 UTC, "status": "complete" |
     "interrupted" | "server_dead" | "failed", "message": str | null,
     "config": {...everything needed to reproduce and to label the run...},
     "levels": [ one entry per concurrency level / rate, in run order ],
     "pareto": {...},
     "launch": {...how loadgen and the server were started (loadgen/run/provenance.py)...} }

Each level holds `counts`, `throughput`, `cache`, `metrics` ({name: {unit, stats, hdr}}),
`loop_lag_warning`, `failed`/`fail_reasons`, and `requests`, the measured requests as columns;
`spec_decode` (null without speculative decoding) holds {k, golden_al, expected_al, measured_al,
measured_from ("usage" | "metrics" | null), num_drafts, num_accepted_tokens, requests_with_usage}
(see loadgen/run/spec_decode.py), and `config.spec_decode` the expectation asked for.

Results are never lost: a run checks its output folder with `check_writable` before it measures
anything, and `save_results` falls back to a temporary file (logged with its path) when the folder
cannot be written at the end anyway (disk full, folder removed or made read-only meanwhile).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from loadgen.results.metric_registry import METRICS
from loadgen.results.metrics import decode_histogram

SCHEMA = "agentload.result/1"
STATUSES = ("complete", "interrupted", "server_dead", "failed")
REQUEST_COLUMNS = ("play", "session", "turn", "isl", "osl", "ttft_us", "e2el_us", "tpot_us")
log = logging.getLogger(__name__)
LEVEL_KEYS = ("concurrency", "rate", "mode", "failed", "fail_reasons", "window_s", "counts",
              "throughput", "cache", "metrics", "requests")


# OPT_NON_STR_KEYS: error counts are keyed by ErrorKind members (str enums), written as their values.
_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class ResultsError(ValueError):
    """A results file that cannot be read or does not follow the schema; names file and field."""


def write_results(path: str | os.PathLike, doc: dict[str, Any]) -> Path:
    """Write `doc` as JSON to `path` atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(orjson.dumps(doc, option=_JSON_OPTIONS))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_writable(folder: str | os.PathLike, flag: str = "--out") -> None:
    """Create `folder` and write (then remove) a probe file in it; ResultsError naming `flag`,
    the folder and why if that fails. Called before a run so that no measurement is lost. The
    folders it had to create are removed again (the results' writer creates them), so a run that
    stops before it measures leaves no empty folder behind."""
    folder = Path(folder)
    created = [path for path in (folder, *folder.parents) if not path.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".write-probe.", dir=folder):
            pass
    except OSError as exc:
        raise ResultsError(f"{flag} {folder}: cannot write there: {exc.strerror or exc}") from None
    finally:
        for path in created:
            try:
                path.rmdir()
            except OSError:
                break


def save_results(path: str | os.PathLike, doc: dict[str, Any]) -> Path:
    """`write_results`, or, when `path` cannot be written, a new temporary file (an error is
    logged naming both); returns the path written. ResultsError if neither can be written."""
    try:
        return write_results(path, doc)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    fd, fallback = tempfile.mkstemp(prefix="agentload-result-", suffix=".json")
    os.close(fd)
    try:
        write_results(fallback, doc)
    except OSError as exc:
        raise ResultsError(f"cannot write results to {path} ({problem}) nor to {fallback} "
                           f"({exc.strerror or exc})") from None
    log.error("cannot write results to %s (%s); wrote them to %s instead", path, problem, fallback)
    return Path(fallback)


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a results file; raises ResultsError naming the file and the field."""
    path = Path(path)
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON: {exc}") from exc
    validate_results(doc, str(path))
    return doc


def validate_results(doc: Any, source: str = "<results>") -> None:
    """Check the structure a reader relies on; every problem names `source` and the field path."""

    def fail(field: str, why: str) -> None:
        raise ResultsError(f"{source}: {field}: {why}")

    if not isinstance(doc, dict):
        fail("<top>", "expected a JSON object")
    if doc.get("schema") != SCHEMA:
        fail("schema", f"expected {SCHEMA!r}, got {doc.get('schema')!r}")
    if doc.get("status") not in STATUSES:
        fail("status", f"expected one of {', '.join(STATUSES)}, got {doc.get('status')!r}")
    if not isinstance(doc.get("config"), dict):
        fail("config", "missing or not an object")
    levels = doc.get("levels")
    if not isinstance(levels, list):
        fail("levels", "missing or not a list")
    for i, level in enumerate(levels):
        _validate_level(level, f"levels[{i}]", fail)
    if "launch" in doc:  # absent in results written before every run kept one
        _validate_launch(doc["launch"], fail)


def _validate_launch(launch: Any, fail) -> None:
    if not isinstance(launch, dict):
        fail("launch", "expected an object")
    if not isinstance(launch.get("server"), dict):
        fail("launch.server", "missing or not an object")
    for where, argv in (("launch.load_argv", launch.get("load_argv")), ("launch.server.argv", launch["server"].get("argv"))):
        if argv is not None and not (isinstance(argv, list) and all(isinstance(arg, str) for arg in argv)):
            fail(where, "expected a list of strings or null")


def _validate_level(level: Any, where: str, fail) -> None:
    if not isinstance(level, dict):
        fail(where, "expected an object")
    for key in LEVEL_KEYS:
        if key not in level:
            fail(f"{where}.{key}", "missing")
    if not isinstance(level["failed"], bool):
        fail(f"{where}.failed", "expected true or false")
    metrics = level["metrics"]
    if not isinstance(metrics, dict):
        fail(f"{where}.metrics", "expected an object")
    for metric in METRICS:
        entry = metrics.get(metric.name)
        field = f"{where}.metrics.{metric.name}"
        if not isinstance(entry, dict):
            fail(field, "missing")
        if not isinstance(entry.get("stats"), dict):
            fail(f"{field}.stats", "missing or not an object")
        if not isinstance(entry.get("hdr"), str):
            fail(f"{field}.hdr", "missing or not a string")
        try:
            hist = decode_histogram(entry["hdr"])
        except ValueError as exc:
            fail(f"{field}.hdr", str(exc))
        if hist.get_total_count() != entry["stats"].get("count"):
            fail(f"{field}.stats.count", "does not match the encoded histogram")
    columns = level["requests"]
    if not isinstance(columns, dict):
        fail(f"{where}.requests", "expected an object of columns")
    lengths = set()
    for name in REQUEST_COLUMNS:
        column = columns.get(name)
        if not isinstance(column, list):
            fail(f"{where}.requests.{name}", "missing or not a list")
        lengths.add(len(column))
    if len(lengths) > 1:
        fail(f"{where}.requests", f"columns differ in length: {sorted(lengths)}")
