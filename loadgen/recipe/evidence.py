"""The review's Pareto evidence per curve, and whether a re-run of a recipe only appended points.

InferenceX's review asks, for every curve a submission touches, how many points were measured, how
many are invalid and how many lie on the frontier (five or more recommended), and that sweeps are
append-only: a re-run adds points to a curve and neither removes nor reruns an earlier one (its
utils/process_changelog.py, append_only_delta).

A curve is one recipe fingerprint (loadgen/recipe/provenance.py; results without one, not run by
`loadgen recipe run`, form one unrecorded curve per file), a point one concurrency (or rate) of it, measured once per
round that ran it. A point is invalid when every measurement of it failed (loadgen's failed level,
whose error rate InferenceX's validator refuses); runs that are no valid AgentX submission (their
`validity` block) are counted apart, with the rules they broke. The frontier is InferenceX's
e2e-normalized one (loadgen/results/pareto.py) over the curve's valid measurements; a point is on it when
one of its measurements is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.recipe.provenance import LAUNCH_KEY
from loadgen.results.pareto import NORMALIZED, frontiers, level_point

RECOMMENDED_POINTS = 5
UNRECORDED = "unrecorded:"  # the fingerprint of a results file without one, before its path
Results = list[tuple[Path, dict[str, Any]]]


@dataclass(frozen=True)
class CurveEvidence:
    fingerprint: str
    variants: tuple[str, ...]
    points: dict[str, int]  # point ("conc 4") -> measurements of it
    invalid: tuple[str, ...]
    frontier: tuple[str, ...]
    runs: int
    not_submissions: int  # runs whose validity block says no valid AgentX submission
    broken_rules: tuple[str, ...]

    def describe(self) -> str:
        valid = len(self.points) - len(self.invalid)
        invalid = f" ({', '.join(self.invalid)})" if self.invalid else ""
        frontier = f" ({', '.join(self.frontier)})" if self.frontier else ""
        lines = [f"curve {self.name} ({', '.join(self.variants)}): {len(self.points)} point"
                 f"{'s' * (len(self.points) != 1)} measured ({', '.join(self.points)}; {self.runs} run"
                 f"{'s' * (self.runs != 1)}), {len(self.invalid)} invalid{invalid}, {len(self.frontier)} on the "
                 f"frontier{frontier}"]
        if valid < RECOMMENDED_POINTS:
            lines.append(f"  {valid} valid point{'s' * (valid != 1)}: the review recommends {RECOMMENDED_POINTS} "
                         "or more per curve")
        if self.not_submissions:
            lines.append(f"  {self.not_submissions} of {self.runs} runs are no valid AgentX submission (broken: "
                         f"{', '.join(self.broken_rules)})")
        return "\n".join(lines)

    @property
    def name(self) -> str:
        """The fingerprint's first 16 digits, or, for a file without one, that file."""
        if self.fingerprint.startswith(UNRECORDED):
            return f"of {self.fingerprint.removeprefix(UNRECORDED)}"
        return self.fingerprint[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"recipe_fingerprint": self.fingerprint, "variants": list(self.variants),
                "points_measured": len(self.points), "measurements": self.points, "invalid": list(self.invalid),
                "on_frontier": list(self.frontier), "runs": self.runs, "not_submissions": self.not_submissions,
                "broken_rules": list(self.broken_rules), "recommended_points": RECOMMENDED_POINTS}


def curve_of(path: Path, doc: dict[str, Any]) -> tuple[str, str]:
    """(fingerprint, variant) of a results document; an unrecorded one is its own curve."""
    launch = doc.get(LAUNCH_KEY) or {}
    if launch.get("recipe_fingerprint"):
        return launch["recipe_fingerprint"], str(launch.get("variant"))
    return f"{UNRECORDED}{path}", path.parent.name


def point_of(level: dict[str, Any]) -> str:
    """'conc 4', 'rate 2.5' or 'mooncake x1.5' (the recorded timestamps, sped up): a level's place on its curve."""
    if level.get("concurrency") is not None:
        return f"conc {level['concurrency']}"
    if level.get("rate") is not None:
        return f"rate {level['rate']:g}"
    return level.get("label") or "mooncake"


def curve_evidence(results: Results) -> list[CurveEvidence]:
    """The evidence of every curve the results measure, in the order they first appear."""
    grouped: dict[str, list[tuple[Path, dict[str, Any]]]] = defaultdict(list)
    variants: dict[str, list[str]] = defaultdict(list)
    for path, doc in results:
        fingerprint, variant = curve_of(path, doc)
        grouped[fingerprint].append((path, doc))
        if variant not in variants[fingerprint]:
            variants[fingerprint].append(variant)
    return [_evidence(fingerprint, tuple(variants[fingerprint]), runs) for fingerprint, runs in grouped.items()]


def describe_evidence(curves: list[CurveEvidence]) -> str:
    """The curves' evidence as text, one curve after another."""
    return "\n".join(curve.describe() for curve in curves)


def _evidence(fingerprint: str, variants: tuple[str, ...], runs: list[tuple[Path, dict[str, Any]]]) -> CurveEvidence:
    counts: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    candidates, owner = [], {}
    broken: set[str] = set()
    not_submissions = 0
    for path, doc in runs:
        validity = doc.get("validity") or {}
        if not validity.get("valid", False):
            not_submissions += 1
            broken.update(validity.get("failed") or ["no validity block"])
        for index, level in enumerate(doc["levels"]):
            point = point_of(level)
            counts[point] += 1
            failed[point] += bool(level["failed"])
            candidate = level_point(level, index, str(path))
            if candidate is not None:
                candidates.append(candidate)
                owner[candidate] = point
    on_frontier = {owner[p] for p in frontiers(candidates)[NORMALIZED]}
    ordered = sorted(counts, key=_order)
    return CurveEvidence(fingerprint, variants, {p: counts[p] for p in ordered},
                         tuple(p for p in ordered if failed[p] == counts[p]),
                         tuple(p for p in ordered if p in on_frontier), len(runs), not_submissions,
                         tuple(sorted(broken)))


def append_only(earlier: Results, later: Results) -> tuple[bool, list[str]]:
    """Whether `later` only adds points to `earlier`'s curves (or new curves): no point rerun, no curve of a
    variant changed under it; the lines that say so."""
    before = _points(earlier)
    after = _points(later)
    named_before = {variant: fingerprint for fingerprint, variant, _ in before}
    problems = [f"reruns {point} of curve {fingerprint[:16]} ({variant})"
                for fingerprint, variant, point in sorted(after & before)]
    problems += [f"changes the curve of variant {variant} ({named_before[variant][:16]} -> {fingerprint[:16]}): a "
                 "changed recipe starts a new curve; its earlier points are not extended"
                 for fingerprint, variant in sorted({(f, v) for f, v, _ in after})
                 if variant in named_before and named_before[variant] != fingerprint]
    if problems:
        return False, ["append-only: no: " + problem for problem in problems]
    added: dict[tuple[str, str], list[str]] = defaultdict(list)
    for fingerprint, variant, point in sorted(after - before, key=lambda t: (t[0], t[1], _order(t[2]))):
        added[(fingerprint, variant)].append(point)
    if not added:
        return False, ["append-only: no: the re-run adds no point"]
    return True, [f"append-only: yes: adds {', '.join(points)} to curve {fingerprint[:16]} ({variant})"
                  for (fingerprint, variant), points in added.items()]


def _points(results: Results) -> set[tuple[str, str, str]]:
    points: set[tuple[str, str, str]] = set()
    for path, doc in results:
        fingerprint, variant = curve_of(path, doc)
        points.update((fingerprint, variant, point_of(level)) for level in doc["levels"])
    return points


def _order(point: str) -> tuple[str, float]:
    kind, _, value = point.partition(" ")
    try:
        return kind, float(value.removeprefix("x"))
    except ValueError:  # "mooncake": the recorded speed
        return kind, 1.0

