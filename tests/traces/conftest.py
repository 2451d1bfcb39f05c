"""Helpers shared by the traces tests: write real trace files in the formats the readers accept."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest


def small_session(session_id: str = "tiny") -> dict[str, Any]:
    """A parent with three requests and one subagent of two requests, block size 4."""
    return {
        "id": session_id,
        "models": ["m-big"],
        "block_size": 4,
        "hash_id_scope": "local",
        "tool_tokens": 7,
        "system_tokens": 3,
        "requests": [
            {"t": 0.0, "type": "n", "model": "m-big", "in": 10, "out": 5, "hash_ids": [1, 2],
             "input_types": ["text"], "output_types": ["text", "thinking"], "stop": "tool_use",
             "api_time": 2.0, "think_time": 0.0},
            {"t": 7.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore",
             "duration_ms": 4000, "total_tokens": 27, "tool_use_count": 1, "status": "completed",
             "models": ["m-small"], "requests": [
                 {"t": 0.0, "type": "s", "in": 9, "out": 3, "hash_ids": [1, 2], "api_time": 1.0,
                  "think_time": 0.0, "ttft": 0.5},
                 {"t": 2.0, "type": "n", "in": 13, "out": 2, "hash_ids": [1, 2, 7], "api_time": 1.0,
                  "think_time": 1.0},
             ]},
            {"t": 5.0, "type": "n", "in": 14, "out": 4, "hash_ids": [1, 2, 3], "api_time": 1.5,
             "think_time": 3.0},
            {"t": 10.0, "type": "n", "in": 12, "out": 1, "hash_ids": [1, 5, 6], "api_time": 0.5,
             "think_time": 3.5},
        ],
    }


def write_json(path: Path, document: Any, gz: bool = False) -> Path:
    data = orjson.dumps(document)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    return path


class TraceFiles:
    """Writes trace files into one test's temporary directory."""

    session = staticmethod(small_session)

    def __init__(self, root: Path) -> None:
        self.root = root

    def json(self, name: str, document: Any, gz: bool = False) -> Path:
        return write_json(self.root / name, document, gz)

    def jsonl(self, name: str, records: list[Any]) -> Path:
        return write_jsonl(self.root / name, records)


@pytest.fixture
def files(tmp_path: Path) -> TraceFiles:
    return TraceFiles(tmp_path)


@pytest.fixture
def session_file(files: TraceFiles) -> Path:
    return files.json("tiny.json", small_session())
