"""Per-turn, per-context and per-session breakdowns of one level's measured requests.

`turn_summary` reads a level's request columns (`requests` in the results file, see
docs/results_schema.md) and returns the level's `turns` block:

- `by_turn`: the parent requests grouped by turn index in log-spaced buckets (TURN_BUCKETS), so a
  200-turn session gives 8 rows; None when the columns have no `agent` (results of earlier versions
  cannot tell a parent's request from a subagent's);
- `by_context`: every request grouped by its input tokens, the context it was sent with, in
  doubling buckets (CONTEXT_EDGES); the rows of TTFT against context make the "agentic curve";
- `sessions`: one row per session play measured, and their aggregate.

Percentiles are nearest-rank (the smallest value with at least q % of the values at or below it),
the estimator `loadgen compare` reads request columns with (loadgen/compare/stats.py), so both say
the same of the same requests; they can differ from the HDR statistics by HDR's 0.1 % bucket width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# [first, last] turn index of each by-turn bucket, last None: open-ended
TURN_BUCKETS: tuple[tuple[int, int | None], ...] = (
    (0, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127), (128, None))
# lower edges of the by-context buckets in input tokens: under 1k, then doubling up to 256k and above
CONTEXT_EDGES: tuple[int, ...] = (0, *(1024 << i for i in range(9)))
# (row key, request column, column unit -> shown unit, decimals kept)
STATISTICS = (("ttft_ms", "ttft_us", 1e-3, 3), ("tpot_ms", "tpot_us", 1e-3, 3), ("e2el_s", "e2el_us", 1e-6, 6))


def turn_summary(columns: Mapping[str, Sequence], good: Sequence[bool] | np.ndarray | None = None,
                 session_turns: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The `turns` block of a level from its request columns. `good`: per request, whether it met
    the run's first SLO (None: no good shares); `session_turns`: session id -> its number of parent
    requests (None: whether a play was seen whole stays unknown)."""
    n = len(columns["play"])
    ok = None if good is None else np.asarray(good, dtype=bool)
    if ok is not None and ok.size != n:
        raise ValueError(f"good: {ok.size} values for {n} requests")
    values = {key: np.asarray(columns[name], dtype=np.float64) * scale for key, name, scale, _ in STATISTICS}
    isl = np.asarray(columns["isl"], dtype=np.int64)
    parent = _parents(columns)
    by_turn = None
    if parent is not None:
        turn = np.asarray(columns["turn"], dtype=np.int64)
        lows = [low for low, _ in TURN_BUCKETS]
        bucket = np.where(parent, np.searchsorted(lows, turn, side="right") - 1, -1)
        by_turn = _rows("turns", [(low, high, _turn_label(low, high)) for low, high in TURN_BUCKETS],
                        bucket, isl, values, ok)
    context = [(low, high, _context_label(low, high))
               for low, high in zip(CONTEXT_EDGES, (*CONTEXT_EDGES[1:], None))]
    by_context = _rows("context", context, np.searchsorted(CONTEXT_EDGES, isl, side="right") - 1, isl, values, ok)
    return {"by_turn": by_turn, "by_context": by_context,
            "sessions": _sessions(columns, values["e2el_s"], parent, ok, session_turns)}


def _parents(columns: Mapping[str, Sequence]) -> np.ndarray | None:
    """Per request, whether a parent sent it ("" agent); None without the `agent` column."""
    agents = columns.get("agent")
    return None if agents is None else np.array([not agent for agent in agents], dtype=bool)


def _rows(key: str, buckets: Sequence[tuple[int, int | None, str]], bucket: np.ndarray, isl: np.ndarray,
          values: Mapping[str, np.ndarray], ok: np.ndarray | None) -> list[dict[str, Any]]:
    """One row per non-empty bucket; `bucket` holds each request's bucket index (-1: none)."""
    rows = []
    for index, (low, high, label) in enumerate(buckets):
        members = np.flatnonzero(bucket == index)
        if not members.size:
            continue
        row: dict[str, Any] = {key: [low, high], "label": label, "requests": int(members.size),
                               "isl_mean": round(float(isl[members].mean()), 1)}
        for name, _, _, decimals in STATISTICS:
            p50, p90 = _nearest_rank(values[name][members], (50, 90))
            row[name] = {"p50": _round(p50, decimals), "p90": _round(p90, decimals)}
        row["good_share"] = None if ok is None else round(float(ok[members].mean()), 6)
        rows.append(row)
    return rows


def _sessions(columns: Mapping[str, Sequence], e2el_s: np.ndarray, parent: np.ndarray | None, ok: np.ndarray | None,
              session_turns: Mapping[str, int] | None) -> dict[str, Any]:
    """One row per play (a session, or a recycled replay of it, with its subagents), and their aggregate."""
    plays, first, play_of = np.unique(np.asarray(columns["play"], dtype=np.int64), return_index=True,
                                      return_inverse=True)
    requests = np.bincount(play_of, minlength=plays.size)
    shares = None if ok is None else np.bincount(play_of, weights=ok, minlength=plays.size) / np.maximum(requests, 1)
    wall = _wall_s(columns, e2el_s, play_of, plays.size)
    turns = None if parent is None else _parent_turns(np.asarray(columns["turn"], dtype=np.int64), parent, play_of,
                                                      plays.size)
    rows = []
    for j, play in enumerate(plays.tolist()):
        session = columns["session"][first[j]]
        span = None if turns is None or turns[0][j] < 0 else [int(turns[0][j]), int(turns[1][j])]
        rows.append({"play": play, "session": session, "requests": int(requests[j]), "parent_turns": span,
                     "whole": _whole(span, session, session_turns) if turns is not None else None,
                     "wall_s": None if wall is None else round(float(wall[j]), 3),
                     "good_share": None if shares is None else round(float(shares[j]), 6)})
    return {"count": len(rows),
            "whole_count": None if session_turns is None or turns is None else sum(r["whole"] is True for r in rows),
            "wall_s": None if wall is None else _spread(wall, ("p50", 50), ("p90", 90), ("max", 100), decimals=3),
            "good_share": None if shares is None else _share_spread(shares),
            "all_good": None if shares is None else int(np.count_nonzero(shares == 1.0)),
            "rows": rows}


def _wall_s(columns: Mapping[str, Sequence], e2el_s: np.ndarray, play_of: np.ndarray, plays: int) -> np.ndarray | None:
    """Per play, first request's start to last request's end, in seconds; None without `start_ms`."""
    if "start_ms" not in columns:
        return None
    start_s = np.asarray(columns["start_ms"], dtype=np.float64) / 1000
    begin, end = np.full(plays, np.inf), np.full(plays, -np.inf)
    np.minimum.at(begin, play_of, start_s)
    np.maximum.at(end, play_of, start_s + e2el_s)
    return end - begin


def _parent_turns(turn: np.ndarray, parent: np.ndarray, play_of: np.ndarray,
                  plays: int) -> tuple[np.ndarray, np.ndarray]:
    """Per play, its first and last parent turn measured (-1, -1: only subagents' requests)."""
    first, last = np.full(plays, np.iinfo(np.int64).max), np.full(plays, -1)
    np.minimum.at(first, play_of[parent], turn[parent])
    np.maximum.at(last, play_of[parent], turn[parent])
    return np.where(last < 0, -1, first), last


def _whole(span: list[int] | None, session: str, session_turns: Mapping[str, int] | None) -> bool | None:
    """Whether the window saw the play from its first parent request to its last (None: not known)."""
    total = None if session_turns is None else session_turns.get(session)
    if total is None:
        return None
    return span is not None and span[0] == 0 and span[1] == total - 1


def _share_spread(shares: np.ndarray) -> dict[str, float | None]:
    """Mean, p10 (the worst tenth of the plays) and min of the plays' good shares."""
    mean = round(float(shares.mean()), 6) if shares.size else None
    return {"mean": mean, **_spread(shares, ("p10", 10), ("min", 0), decimals=6)}


def _spread(values: np.ndarray, *stats: tuple[str, float], decimals: int) -> dict[str, float | None]:
    found = _nearest_rank(values, [q for _, q in stats])
    return {name: _round(value, decimals) for (name, _), value in zip(stats, found)}


def _nearest_rank(values: np.ndarray, qs: Sequence[float]) -> list[float | None]:
    """Nearest-rank percentiles of the defined (non-NaN) values; None for each when there are none.
    numpy's `inverted_cdf` is that estimator (tests/loadgen/test_compare_stats.py checks it against
    compare's weighted one)."""
    defined = values[~np.isnan(values)]
    if not defined.size:
        return [None] * len(qs)
    return [float(v) for v in np.percentile(defined, list(qs), method="inverted_cdf")]


def _round(value: float | None, decimals: int) -> float | None:
    return None if value is None else round(value, decimals)


def _turn_label(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


def _context_label(low: int, high: int | None) -> str:
    if high is None:
        return f">={low // 1024}k"
    return f"<{high // 1024}k" if low == 0 else f"{low // 1024}k-{high // 1024}k"
