"""Output of `loadgen compare`: the JSON document (schema agentload.compare/1) and the text table.

Each level's table says what its base and new columns are (the values the delta is computed
from: with paired rounds, geometric means over the rounds of matched-request values, not the
percentiles over all requests of `loadgen report`), and with paired rounds ends every row with
each round's own change, whose spread is the noise its interval has to cover."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.compare.significance import CONFIDENCE
from loadgen.compare.verdicts import Comparison


def to_json(comparison: Comparison, base_files: Sequence[str], new_files: Sequence[str],
            tripped: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "agentload.compare/1",
        "base": list(base_files), "new": list(new_files),
        "confidence": CONFIDENCE, "resamples": comparison.resamples, "seed": comparison.seed,
        "min_effect_pct": comparison.min_effect_pct, "fdr": comparison.fdr, "paired": comparison.paired,
        "block_variants": comparison.blocks,
        "run_noise_pct": dict(comparison.run_noise.sd_pct) if comparison.run_noise else None,
        "run_noise_runs": comparison.run_noise.runs if comparison.run_noise else None,
        "levels": [{
            "label": level.label, "method": level.method, "detail": level.detail, "values": level.values,
            "run_to_run_noise": level.run_to_run,
            "base_requests": level.base_requests, "new_requests": level.new_requests,
            "base_failed": level.base_failed, "new_failed": level.new_failed,
            "metrics": [{
                "metric": r.metric.name, "unit": r.metric.unit, "higher_is_better": r.metric.higher_is_better,
                "base": _round(r.base), "new": _round(r.new), "delta_pct": _round(r.delta_pct),
                "ci_pct": [_round(x) for x in r.ci_pct] if r.ci_pct else None,
                "p_value": _round(r.p_value), "verdict": r.verdict,
                "rounds_pct": [_round(x) for x in r.rounds_pct] if r.rounds_pct else None,
            } for r in level.results],
        } for level in comparison.levels],
        "only_in_base": list(comparison.only_base), "only_in_new": list(comparison.only_new),
        "regressions": list(tripped),
    }


def format_comparison(comparison: Comparison, tripped: Sequence[dict[str, Any]]) -> str:
    pct = int(CONFIDENCE * 100)
    lines = []
    for level in comparison.levels:
        flags = "".join(f" [{side} level FAILED]" for side, bad in (("base", level.base_failed),
                                                                    ("new", level.new_failed)) if bad)
        how = ("bootstrap" if not level.run_to_run else "paired t over rounds" if level.method.startswith("paired")
               else "Welch t on per-run values" if comparison.run_noise is None
               else "t on per-run values pooled with the A/A run noise")
        lines.append(f"== {level.label}: {level.base_requests} vs {level.new_requests} requests; "
                     f"{pct} % interval by {how}, {level.detail}{flags}")
        lines.append(f"   base, new: {level.values}; delta = new / base - 1")
        rounds = any(r.rounds_pct for r in level.results)
        lines.append((f"   {'metric':<30}{'unit':>7}{'base':>11}{'new':>11}{'delta':>9}   {pct}% CI of delta"
                      f"{'':>7}{'verdict':<14}" + ("per round, %" if rounds else "")).rstrip())
        for r in level.results:
            ci = f"[{r.ci_pct[0]:+.1f}, {r.ci_pct[1]:+.1f}] %" if r.ci_pct else "-"
            delta = f"{r.delta_pct:+.1f}%" if r.delta_pct is not None else "-"
            changes = " ".join("-" if x is None else f"{x:+.1f}" for x in r.rounds_pct)
            lines.append(f"   {r.metric.label:<30}{r.metric.unit:>7}{_num(r.base):>11}{_num(r.new):>11}"
                         f"{delta:>9}   {ci:<22}{r.verdict:<14}{changes}".rstrip())
    for side, labels in (("base", comparison.only_base), ("new", comparison.only_new)):
        if labels:
            lines.append(f"only in {side} (not compared): {', '.join(labels)}")
    lines.append("interactivity pX = 1 / pX(TPOT) (slow tail); e2e interactivity = 1 / p90(E2EL/OSL); "
                 f"better/worse: the interval excludes 0 and the change survives Benjamini-Hochberg at FDR "
                 f"{comparison.fdr:g} over all rows"
                 + (f" and |delta| >= {comparison.min_effect_pct:g} %" if comparison.min_effect_pct else ""))
    if any(r.rounds_pct for level in comparison.levels for r in level.results):
        lines.append("per round: each round's own new / base - 1 (the delta is their geometric mean over the rounds "
                     "the test used); a spread far wider than the interval says the machine moved between runs")
    if any(not level.run_to_run for level in comparison.levels):
        lines.append("single run per side: the interval sees the sessions' variation only, not run-to-run noise "
                     "(identical runs can differ by more); run repeats (--repeat, several files per side, "
                     "`loadgen recipe`) or give --run-noise")
    for trip in tripped:
        lines.append(f"REGRESSION: {trip['level']}: {trip['metric']} worse by {abs(trip['delta_pct']):.1f} % "
                     f"(> {trip['threshold_pct']:g} %, interval [{trip['ci_pct'][0]:+.1f}, "
                     f"{trip['ci_pct'][1]:+.1f}] %)")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)
