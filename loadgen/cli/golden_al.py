"""`loadgen golden-al`: list the bundled golden acceptance-length curves, show one, or select the
AL for a model prefix and draft length the way InferenceX does.

`show` prints AL per k and thinking mode, and the per-position acceptance rates a synthetic
sampler would use for each k (min-variance by default, as vLLM does), so what a run asks the
server for can be checked before the run. `select PREFIX --spec-k K` maps an InferenceX model
prefix to its model's curve and prints the one AL (thinking mode `on` unless told, InferenceX's
default; a mode the curve lacks is an error). `pins [PREFIX]` lists the draft length and AL each
InferenceX agentic launch script fixes (golden_al/infx_pins.yaml), checked against the curve.
Curve references are described in golden_al/curves.py.
"""

from __future__ import annotations

import argparse
import json

from golden_al.curves import Curve
from golden_al.pins import THINKING, THINKING_MODES, Pin
from loadgen.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "golden-al",
        help="golden acceptance-length curves (speculative decoding)",
        description="Golden acceptance lengths (AL = tokens per verify step) per model, "
        "draft length k and thinking mode, as published by SemiAnalysis InferenceX.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    list_parser = actions.add_parser("list", help="list the bundled curves")
    list_parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_parser.set_defaults(func=run_list)

    show_parser = actions.add_parser("show", help="AL per k and mode, with per-position rates")
    show_parser.add_argument("curve", metavar="REF",
                             help="bundled curve name, YAML path (FILE:MODEL for a file of several models) "
                             "or model prefix")
    show_parser.add_argument(
        "--schedule",
        default="min-variance",
        help="how the mean AL is spread over draft positions: min-variance (default, as vLLM) "
        "or geometric",
    )
    show_parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    show_parser.set_defaults(func=run_show)

    select_parser = actions.add_parser(
        "select", help="the AL for a model prefix and draft length, as InferenceX selects it")
    select_parser.add_argument("prefix", metavar="MODEL_PREFIX",
                               help="InferenceX model prefix (e.g. dsv4) or model key")
    select_parser.add_argument("--spec-k", type=int, required=True, metavar="K", help="num_speculative_tokens")
    select_parser.add_argument("--thinking", choices=THINKING_MODES, default=THINKING,
                               help=f"thinking mode (default: {THINKING}, as InferenceX)")
    select_parser.add_argument("--json", action="store_true", help="print JSON")
    select_parser.set_defaults(func=run_select)

    pins_parser = actions.add_parser(
        "pins", help="the draft length and AL each InferenceX agentic launch script fixes",
        description="InferenceX's single-node agentic launch scripts fix k (by concurrency in some) and the "
        "golden AL they pin (golden_al/infx_pins.yaml); each is checked against the bundled curve.")
    pins_parser.add_argument("prefix", nargs="?", metavar="MODEL_PREFIX", help="only this model prefix's scripts")
    pins_parser.add_argument("--json", action="store_true", help="print JSON")
    pins_parser.set_defaults(func=run_pins)


def run_list(args: argparse.Namespace) -> int:
    from golden_al.curves import bundled_curves

    curves = bundled_curves()
    if args.json:
        listing = [
            {
                "name": curve.name,
                "model_key": curve.model_key,
                "method": curve.method,
                "modes": {mode: sorted(points) for mode, points in curve.modes.items()},
            }
            for curve in curves
        ]
        print(json.dumps(listing, indent=2))
        return 0
    rows = [
        [
            curve.name,
            curve.model_key,
            curve.method or "-",
            ", ".join(curve.modes),
            _k_ranges(curve.modes),
        ]
        for curve in curves
    ]
    print(_table(["name", "model key", "method", "modes", "k"], rows))
    return 0


def run_show(args: argparse.Namespace) -> int:
    from golden_al.curves import format_ks, load_curve
    from golden_al.schedules import schedule_rates

    curve = load_curve(args.curve)
    rates = {
        mode: {k: schedule_rates(args.schedule, al, k) for k, al in points.items()}
        for mode, points in curve.modes.items()
    }
    if args.json:
        shown = {
            "name": curve.name,
            "model_key": curve.model_key,
            "file": str(curve.source),
            "provenance": curve.provenance,
            "not_measured": {mode: ks for mode, ks in curve.not_measured.items()},
            "al": {mode: {str(k): al for k, al in points.items()} for mode, points in curve.modes.items()},
            "schedule": args.schedule,
            "rates": {mode: {str(k): r for k, r in by_k.items()} for mode, by_k in rates.items()},
        }
        print(json.dumps(shown, indent=2))
        return 0
    print(f"{curve.name}: {curve.model_key}  ({curve.source})")
    for key, value in curve.provenance.items():
        print(f"  {key}: {value}")
    for mode, ks in curve.not_measured.items():
        print(f"  not measured (N/A): {mode} k={format_ks(ks)}")
    modes = list(curve.modes)
    ks = sorted({k for points in curve.modes.values() for k in points})
    al_rows = [[str(k)] + [_fmt(curve.modes[mode].get(k)) for mode in modes] for k in ks]
    print()
    print(_table(["k"] + modes, al_rows))
    print()
    print(f"{args.schedule} per-position rates r_i = P(draft i accepted):")
    rate_rows = [
        [mode, str(k), " ".join(f"{r:.3f}" for r in by_k[k])]
        for mode, by_k in rates.items()
        for k in sorted(by_k)
    ]
    print(_table(["mode", "k", "r_1 .. r_k"], rate_rows))
    return 0


def run_select(args: argparse.Namespace) -> int:
    from golden_al.curves import select_by_model

    curve = select_by_model(args.prefix)
    al = curve.al(args.spec_k, args.thinking == "on")
    if args.json:
        print(json.dumps({"prefix": args.prefix, "model_key": curve.model_key, "curve": curve.name,
                          "file": str(curve.source), "k": args.spec_k, "thinking": args.thinking, "al": al}))
    else:
        print(f"{args.prefix} -> {curve.model_key} ({curve.name}): k={args.spec_k} thinking_{args.thinking} AL {al:g}")
    return 0


def run_pins(args: argparse.Namespace) -> int:
    from golden_al.curves import select_by_model
    from golden_al.pins import pins

    chosen = [pin for pin in pins() if args.prefix in (None, pin.prefix)]
    if not chosen:
        raise UsageError(f"no InferenceX launch script pins a draft length for {args.prefix!r}")
    curves = {pin.prefix: select_by_model(pin.prefix) for pin in chosen}
    mismatches = {pin.script: _disagreements(pin, curves[pin.prefix]) for pin in chosen}
    if args.json:
        print(json.dumps([{"script": pin.script, "prefix": pin.prefix, "curve": curves[pin.prefix].name,
                           "drafts": pin.describe(), "curve_agrees": not mismatches[pin.script],
                           "curve_says": mismatches[pin.script]} for pin in chosen], indent=2))
        return 0
    print(_table(["script", "curve", f"drafts (thinking {THINKING})", "curve agrees"],
                 [[pin.script, curves[pin.prefix].name, pin.describe(), ", ".join(mismatches[pin.script]) or "yes"]
                  for pin in chosen]))
    return 0


def _disagreements(pin: Pin, curve: Curve) -> list[str]:
    """The pin's drafts whose AL the curve does not give, as 'k=K: the curve's AL'."""
    curve_al = {draft.k: curve.al(draft.k, THINKING == "on") for draft in pin.drafts}
    return [f"k={draft.k}: {curve_al[draft.k]:g}" for draft in pin.drafts if curve_al[draft.k] != draft.al]


def _k_ranges(modes: dict[str, dict[int, float]]) -> str:
    """One k range when every mode has the same ks, else one per mode in mode order."""
    from golden_al.curves import format_ks

    ranges = [format_ks(points) for points in modes.values()]
    return ranges[0] if len(set(ranges)) == 1 else ", ".join(ranges)


def _fmt(al: float | None) -> str:
    return "-" if al is None else f"{al:.2f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    lines = [headers, ["-" * width for width in widths], *rows]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)
