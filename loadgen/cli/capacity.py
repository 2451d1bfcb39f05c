"""`loadgen capacity`: the largest number of concurrent agents (or open-loop request rate) at
which a server holds an SLO, found by a probe-then-bisect search and reported as an interval
(loadgen/capacity/). Takes the server, load and trace flags of `loadgen replay` except the
levels (`--conc`, `--rate`, `--repeat`), which the search chooses. Writes the same results file
as `loadgen replay`, one level per probe, with a `capacity` block, and report/ beside it (plots,
the attainment curve among them, and report.html). Exit codes as `loadgen replay`.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from loadgen.capacity.config import add_search_flags
    from loadgen.cli.replay import add_replay_flags

    p = subparsers.add_parser(
        "capacity",
        help="find the most concurrent agents (or requests/s) a server carries within an SLO",
        description="Search the largest load at which a server holds an SLO: the share of good requests (all "
        "bounds met, no error) at or above --attainment. Probes double the load until one fails, then bisect; "
        "each probe is a measured level, as a sweep's (a probe whose verdict is decided stops early). Capacity is "
        "reported as an interval read off the attainment curve, and per GPU.",
    )
    add_replay_flags(p, http=True, levels=False)
    add_search_flags(p)
    p.add_argument("--no-report", action="store_true",
                   help="skip the PNG plots (the attainment curve among them) and the HTML report in report/")
    for action in p._actions:  # our server with the bundled sessions: the probes' window as bench's levels
        if action.dest in ("duration", "warmup"):
            action.help = (action.help or "").rsplit(" (default", 1)[0] + (
                f" (default {action.default}; our server with the bundled sessions: the `loadgen bench` preset "
                "for its model)")
            action.default = None
    p.set_defaults(func=run, capacity=True)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from loadgen.report.html import write_report_folder
    from loadgen.run.flags import default_out_dir
    from loadgen.run.replay import replay_main

    if args.out is None:
        args.out = str(default_out_dir())
    code = replay_main(args)
    if not args.no_report:
        write_report_folder(Path(args.out), args.quiet)
    return code
