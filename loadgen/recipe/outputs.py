"""What a finished recipe writes beside its runs: each variant compared with the baseline
(`loadgen compare` over all rounds), the review's Pareto evidence per curve, and the report of
every run on shared axes."""

from __future__ import annotations

from pathlib import Path

from loadgen.recipe.schema import Recipe


def write_outputs(recipe: Recipe, out: Path, runs: list[tuple[str, str]]) -> list[Path]:
    """compare/<variant>-vs-<baseline>.txt|.json and report/ (PNGs, report.html) from the finished
    runs, given as (variant name, run name); the paths written."""
    import orjson

    from loadgen.compare import compare_runs, format_comparison, regressions, to_json
    from loadgen.compare.verdicts import load_run_noise
    from loadgen.results.metric_registry import STATISTIC_BY_NAME, STATISTICS

    loaded = {name: _load(out / "runs" / name / "result.json", name) for _, name in runs}
    by_variant = {v.name: [loaded[name] for owner, name in runs if owner == v.name] for v in recipe.variants}
    (out / "compare").mkdir(exist_ok=True)
    evidence_written, evidence = _evidence(loaded.values(), out / "report")
    if recipe.sweep.capacity is not None:
        written, tables = _capacity_outputs(recipe, out, by_variant)
        return written + evidence_written + _report(list(loaded.values()), out / "report", tables, evidence)
    metrics = [STATISTIC_BY_NAME[m] for m in recipe.compare.metrics] if recipe.compare.metrics else list(STATISTICS)
    noise = load_run_noise(recipe.compare.run_noise) if recipe.compare.run_noise else None
    written, tables = [], []
    base = recipe.baseline.name
    for variant in recipe.variants[1:]:
        sides = [[(str(r.path), r.doc) for r in by_variant[name]] for name in (base, variant.name)]
        # paired: the other variants' runs of the same rounds join the residual variance (a block design)
        blocks = [[(str(r.path), r.doc) for r in by_variant[v.name]] for v in recipe.variants[1:]
                  if v is not variant] if recipe.compare.paired and noise is None else []
        comparison = compare_runs(sides[0], sides[1], metrics, seed=recipe.sweep.seed, fdr=recipe.compare.fdr,
                                  run_noise=noise, paired=recipe.compare.paired, blocks=blocks)
        text = format_comparison(comparison, [])
        stem = out / "compare" / f"{variant.name}-vs-{base}"
        doc = to_json(comparison, [p for p, _ in sides[0]], [p for p, _ in sides[1]], regressions(comparison, []))
        stem.with_suffix(".json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        stem.with_suffix(".txt").write_text(text + "\n")
        written += [stem.with_suffix(".txt"), stem.with_suffix(".json")]
        tables.append((f"{variant.name} vs {base} (baseline)", text))
    written += evidence_written + _report(list(loaded.values()), out / "report", tables, evidence)
    return written


def _evidence(runs, folder: Path) -> tuple[list[Path], str]:
    """report/evidence.txt|.json: the review's Pareto evidence per curve (loadgen/recipe/evidence.py); the
    paths written, and the text, which the report's page shows too."""
    import orjson

    from loadgen.recipe.evidence import curve_evidence, describe_evidence

    curves = curve_evidence([(run.path, run.doc) for run in runs])
    text = describe_evidence(curves)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evidence.txt").write_text(text + "\n")
    (folder / "evidence.json").write_bytes(orjson.dumps([c.to_dict() for c in curves], option=orjson.OPT_INDENT_2))
    return [folder / "evidence.txt", folder / "evidence.json"], text


def _capacity_outputs(recipe: Recipe, out: Path, by_variant: dict) -> tuple[list[Path], list[tuple[str, str]]]:
    """compare/<variant>-vs-<baseline>.txt|.json of capacities round by round (loadgen/compare/capacity.py)."""
    import orjson

    from loadgen.compare.capacity import compare_capacities, format_capacity_comparison

    base = recipe.baseline.name
    docs = {name: [run.doc for run in runs] for name, runs in by_variant.items()}
    written, tables = [], []
    for variant in recipe.variants[1:]:
        others = [docs[v.name] for v in recipe.variants[1:] if v is not variant] if recipe.compare.paired else []
        result = compare_capacities(docs[base], docs[variant.name], others)
        text = format_capacity_comparison(result, base, variant.name)
        stem = out / "compare" / f"{variant.name}-vs-{base}"
        stem.with_suffix(".json").write_bytes(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2))
        stem.with_suffix(".txt").write_text(text + "\n")
        written += [stem.with_suffix(".txt"), stem.with_suffix(".json")]
        tables.append((f"{variant.name} vs {base} (baseline): capacity", text))
    return written, tables


def _load(path: Path, name: str):
    from loadgen.report.runs import Run, load_runs

    run = load_runs([path])[0]
    return Run(run.path, name, run.doc)


def _report(runs: list, folder: Path, tables: list[tuple[str, str]], evidence: str) -> list[Path]:
    """Plots of every variant on shared axes, and one HTML page that also shows each comparison and the
    `evidence` text."""
    from loadgen.report.html import write_html
    from loadgen.report.plots import render_plots

    folder.mkdir(exist_ok=True)
    plots = render_plots(runs, folder)
    page = write_html(runs, folder / "report.html", plots, tables, evidence)
    return [png for png, _ in plots] + [page]
