"""`loadgen traces stats`: what a trace set holds before it is replayed.

Prints sessions, requests, subagents, token and think-time percentiles, recorded durations and
the theoretical prefix-cache hit rate, optionally after the same scaling knobs a replay takes,
so the effect of a context cap or a token scale can be seen (and its dropped/trimmed counts)
before any load is sent. The parser reads only the traces' schema, readers and scaling settings;
the statistics (numpy) load when the command runs, to keep `loadgen --help` fast.
"""

from __future__ import annotations

import argparse

from traces.readers import DEFAULT_SET
from traces.scale import OVER_CONTEXT_POLICIES, ScaleConfig
from traces.schema import FORMATS

SCALE = ScaleConfig()  # a replay's scaling defaults


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "traces",
        help="inspect agentic session traces and Mooncake traces",
        description="Inspect trace sets: the bundled agentic-coding sessions, session trace files "
        "or directories, and Mooncake JSONL.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    stats = actions.add_parser(
        "stats",
        help="sessions, token and think-time percentiles, durations, theoretical cache hit rate",
        description="Statistics of a trace set, optionally after scaling it as a replay would.",
    )
    stats.add_argument(
        "source",
        nargs="?",
        default=DEFAULT_SET,
        metavar="PATH|NAME",
        help=f"trace file, directory or bundled set name (default: {DEFAULT_SET})",
    )
    stats.add_argument(
        "--format",
        choices=("auto", *FORMATS),
        default="auto",
        help="trace format (default: auto-detect from the first record)",
    )
    stats.add_argument(
        "--block-size",
        type=int,
        default=None,
        metavar="N",
        help="tokens per hash id when the file does not say (default: 64 sessions, 512 Mooncake)",
    )
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    scaling = stats.add_argument_group("scaling (as a replay applies it)")
    scaling.add_argument("--max-context", type=int, default=SCALE.max_context, metavar="N",
                         help="requests with input+output over N tokens are dropped or trimmed")
    scaling.add_argument("--over-context", choices=OVER_CONTEXT_POLICIES, default=SCALE.over_context,
                         help="drop such requests or trim their input to its leading N-output tokens "
                         f"(default {SCALE.over_context})")
    scaling.add_argument("--token-scale", type=float, default=SCALE.token_scale, metavar="X",
                         help=f"multiply input and output token counts by X (default {SCALE.token_scale:g})")
    scaling.add_argument("--think-time-scale", type=float, default=SCALE.think_time_scale, metavar="X",
                         help=f"multiply think times by X (default {SCALE.think_time_scale:g})")
    scaling.add_argument("--think-time-cap", type=float, default=SCALE.think_time_cap, metavar="S",
                         help="cap think times at S seconds")
    stats.set_defaults(func=run_stats)


def run_stats(args: argparse.Namespace) -> int:
    import orjson

    from traces import ScaleConfig, load_traces, scale_traces, trace_stats

    traces = load_traces(args.source, fmt=args.format, block_size=args.block_size)
    config = ScaleConfig(
        max_context=args.max_context,
        over_context=args.over_context,
        token_scale=args.token_scale,
        think_time_scale=args.think_time_scale,
        think_time_cap=args.think_time_cap,
    )
    report = None
    if config != ScaleConfig():
        traces, report = scale_traces(traces, config)
    stats = trace_stats(traces, report)
    if args.json:
        print(orjson.dumps(stats.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        print(stats.format_table())
    return 0
