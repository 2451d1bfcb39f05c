"""Typed fields of trace records, read with errors that name the file, the request path and the field.

Each reader checks one field of a JSON object: its type, that it is not negative, and that it is
within bounds (MAX_COUNT tokens, MAX_BLOCK tokens per hash id, MAX_SECONDS) that keep synthesis and
statistics arithmetic exact; anything else raises TraceError through `Where.fail`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traces.schema import TraceError


@dataclass(frozen=True, slots=True)
class Where:
    """Where a value sits, for error messages: file, record and request path."""

    source: str
    path: str = ""

    def at(self, part: str) -> Where:
        return Where(self.source, f"{self.path}.{part}" if self.path else part)

    def fail(self, field: str | None, problem: str) -> TraceError:
        place = f"{self.source}: {self.path}" if self.path else self.source
        return TraceError(f"{place}: field '{field}': {problem}" if field else f"{place}: {problem}")


def check_object(where: Where, record: Any) -> Where:
    if not isinstance(record, dict):
        raise where.fail(None, f"expected a JSON object, got {type(record).__name__}")
    return where


MAX_COUNT = 10**9  # tokens in one field: far beyond any context, and small enough to compute with
MAX_BLOCK = 1 << 16  # tokens per hash id: each id's block is synthesised whole
MAX_SECONDS = 1e12  # a time or duration: finite, and far from the float range where arithmetic overflows


def req_int(where: Where, item: dict[str, Any], field: str, positive: bool = False) -> int:
    value = item.get(field)
    if value is None:
        raise where.fail(field, "missing" if field not in item else "null")
    value = check_int(where, field, value)
    if positive and value == 0:
        raise where.fail(field, "must be positive, got 0 (a request sends at least one token)")
    return value


def opt_int(where: Where, item: dict[str, Any], field: str, positive: bool = False) -> int | None:
    value = item.get(field)
    if value is None:
        return None
    value = check_int(where, field, value)
    if positive and value == 0:
        raise where.fail(field, "must be positive, got 0")
    return value


def check_int(where: Where, field: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.fail(field, f"expected an integer, got {value!r}")
    if value < 0:
        raise where.fail(field, f"must not be negative, got {value}")
    if value > MAX_COUNT:
        raise where.fail(field, f"must be at most {MAX_COUNT:,}, got {value:.3g}")
    return value


def req_float(where: Where, item: dict[str, Any], field: str) -> float:
    value = opt_float(where, item, field)
    if value is None:
        raise where.fail(field, "missing" if field not in item else "null")
    return value


def opt_float(where: Where, item: dict[str, Any], field: str) -> float | None:
    value = item.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise where.fail(field, f"expected a number, got {value!r}")
    if value < 0:
        raise where.fail(field, f"must not be negative, got {value}")
    if value > MAX_SECONDS:
        raise where.fail(field, f"must be at most {MAX_SECONDS:.0e}, got {value:.3g}")
    return float(value)


def opt_str(where: Where, item: dict[str, Any], field: str) -> str | None:
    value = item.get(field)
    if value is None or isinstance(value, str):
        return value
    raise where.fail(field, f"expected a string, got {value!r}")


def str_tuple(where: Where, item: dict[str, Any], field: str) -> tuple[str, ...]:
    value = item.get(field)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise where.fail(field, f"expected a list of strings, got {value!r}")
    return tuple(value)
