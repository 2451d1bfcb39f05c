"""`loadgen replay`: replay agentic sessions against an OpenAI-compatible server, level by level.

Closed loop by default (`--conc`), open loop with `--rate` (Poisson) or a Mooncake trace
(recorded timestamps, `--time-scale`). Prints a table per level and writes one results file
(`agentload.result/1`, see loadgen/results/file.py). Exit codes: 0 all levels passed, 1 a level
failed or the server died, 2 bad input, 130 interrupted (results of what ran are still written).
"""

from __future__ import annotations

import argparse

from golden_al.pins import THINKING_CHOICES
from loadgen.defaults import DEFAULTS, ENDPOINTS
from traces.scale import OVER_CONTEXT_POLICIES, ScaleConfig
from traces.schema import FORMATS

SCALE = ScaleConfig()  # the traces' scaling defaults


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay agentic sessions against a server and measure each concurrency level",
        description="Replay agentic coding sessions (multi-turn, think time, subagents) against an "
        "OpenAI-compatible server. Closed loop: --conc N live session trees per level. Open loop: "
        "--rate R (Poisson) or a Mooncake trace (recorded timestamps). Every latency goes into HDR "
        "histograms; results are written as JSON (schema agentload.result/1).",
    )
    add_replay_flags(p, http=True)
    p.set_defaults(func=run)
    set_submission_defaults(p)


def add_replay_flags(p: argparse.ArgumentParser, http: bool, levels: bool = True) -> None:
    """The replay flags; `loadgen bench` (in-process, http=False) leaves out the ones naming an HTTP
    target, `loadgen capacity` (levels=False) the ones listing the levels, which its search chooses."""
    target = p.add_argument_group("server")
    if http:
        target.add_argument("--url", default=DEFAULTS.url,
                            help=f"server base URL (default {DEFAULTS.url}: where `server start` listens)")
        target.add_argument("--endpoint", choices=ENDPOINTS, default=DEFAULTS.endpoint,
                            help="completions: prompt as token ids, exact length (default); chat: messages "
                            "whose text is the token ids as decimal words (length approximate)")
        target.add_argument("--model", help="model id to ask for (default: the first id of /v1/models)")
        target.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
        target.add_argument("--header", action="append", default=[], metavar="K:V",
                            help="extra HTTP header (repeatable)")
    target.add_argument("--timeout", type=float, default=DEFAULTS.timeout_s, metavar="S",
                        help=f"per-request limit in seconds, also bounds the drain (default {DEFAULTS.timeout_s:g})")
    target.add_argument("--server-metrics-interval", type=float, default=DEFAULTS.server_metrics_interval_s,
                        metavar="S", help="scrape the server's /metrics every S seconds during each level into the "
                        "results (running/waiting requests, KV-cache usage, prefix-cache hits, preemptions, ... under "
                        "vLLM's, SGLang's or our names); a failed scrape is recorded, never fatal; 0: no scraping "
                        f"(default {DEFAULTS.server_metrics_interval_s:g})")
    target.add_argument("--gpu-telemetry", default=DEFAULTS.gpu_telemetry, metavar="SOURCE",
                        help="GPU power, energy, SM clock, memory and utilisation per GPU, read every "
                        f"{DEFAULTS.gpu_interval_s:g} s during the run, for joules per output token and per request, "
                        "average watts and output tok/s per kW per level: auto (NVML on this host, else amdsmi, "
                        + ("else the server's agentload:gpu_* metrics; " if http else "; ")
                        + "missing telemetry is stated, never 0), nvml, amdsmi"
                        + (", server, off or the URL of a DCGM exporter's /metrics " if http else " or off ")
                        + f"(default {DEFAULTS.gpu_telemetry})")
    target.add_argument("--gpus", type=int, metavar="N",
                        help="GPUs behind the server, for throughput per GPU (default: the server's "
                        "num_gpus when it is ours, else 1)")
    load = p.add_argument_group("load")
    if levels:
        load.add_argument("--conc", default=DEFAULTS.conc, metavar="N[,N...]",
                          help="closed loop: live session trees per level, levels run in order "
                          f"(default {DEFAULTS.conc})")
        load.add_argument("--rate", metavar="R[,R...]",
                          help="open loop: Poisson arrivals per second over the trace's requests, one level per rate")
    load.add_argument("--time-scale", type=float, default=DEFAULTS.time_scale, metavar="F",
                      help="Mooncake traces (always open loop): multiply recorded timestamps by F "
                      f"(default {DEFAULTS.time_scale:g})")
    load.add_argument("--duration", type=float, default=DEFAULTS.duration_s, metavar="S",
                      help=f"measurement window per level in seconds (default {DEFAULTS.duration_s:g})")
    load.add_argument("--warmup", default=DEFAULTS.warmup, metavar="Ns|Nreq",
                      help="warm-up before each window: seconds ('30s') or requests per lane ('2req'; "
                      f"open loop: in total); never counted (default {DEFAULTS.warmup})")
    load.add_argument("--warmup-timeout", type=float, default=DEFAULTS.warmup_timeout_s, metavar="S",
                      help="stop the run when a level's warm-up has not finished after S seconds (a server "
                      f"too slow for the warm-up, or a hung one) (default {DEFAULTS.warmup_timeout_s:g})")
    offset = "{:g}:{:g}".format(*DEFAULTS.start_offset)
    load.add_argument("--start-offset", default=offset, metavar="LO:HI",
                      help="a lane's first session starts at a uniform fraction in [LO, HI] of its "
                      f"requests, after re-sending that request's context as warm-up (default {offset})")
    load.add_argument("--seed", type=int, default=DEFAULTS.seed,
                      help=f"seeds session order, offsets, salts, arrivals (default {DEFAULTS.seed})")
    if levels:
        load.add_argument("--repeat", type=int, default=DEFAULTS.repeat, metavar="N",
                          help="run each level N times in a row (one results entry per repeat, same label), so "
                          "`loadgen compare` can put a confidence interval on run-to-run noise; every repeat "
                          f"replays the same sessions and turns (fresh prompt salts) (default {DEFAULTS.repeat})")
    load.add_argument("--max-error-rate", type=float, default=DEFAULTS.max_error_rate, metavar="F",
                      help="a level with a larger share of failed requests is marked failed "
                      f"(default {DEFAULTS.max_error_rate:.2f})")
    add_slo_flags(p)
    if http:
        from loadgen.run.presets import flag_text
        from loadgen.run.validity import SUBMISSION, submission_flags

        load.add_argument("--submission", action="store_true",
                          help="InferenceX AgentX's submission rules: sets " + flag_text(submission_flags()) +
                          " (each flag you give "
                          "keeps your value) and the results' `validity` block names any rule the run breaks; "
                          f"closed loop only (a window of at least {SUBMISSION.min_window_s:g} s, at most "
                          f"{SUBMISSION.max_over_context_share:.0%}% of requests over the context, ...)")
    tr = p.add_argument_group("traces")
    tr.add_argument("--traces", default=None, metavar="NAME|PATH",
                    help="bundled set name, trace file or directory (default: agentic-coding)")
    tr.add_argument("--trace-format", choices=("auto", *FORMATS), default="auto",
                    help="agentic sessions or Mooncake JSONL (default: detected); Mooncake is replayed open loop")
    tr.add_argument("--max-context", type=int, metavar="TOKENS",
                    help="requests whose input + output exceed this are dropped or trimmed (default: the "
                    "server's max_model_len when it reports one)")
    tr.add_argument("--over-context", choices=OVER_CONTEXT_POLICIES, default=SCALE.over_context,
                    help="over --max-context: drop the request, or trim its input to fit keeping the "
                    f"leading blocks (default: {SCALE.over_context})")

    def scaled(default: float | None) -> str:
        preset = ("; our server with the bundled sessions: the `loadgen bench` preset for its model, printed at "
                  "the start") if http else ""
        return f" (default {'none' if default is None else f'{default:g}'}{preset})"

    tr.add_argument("--token-scale", type=float, metavar="F", help="multiply token counts" + scaled(SCALE.token_scale))
    tr.add_argument("--think-time-scale", type=float, metavar="F",
                    help="multiply think times and subagent start gaps" + scaled(SCALE.think_time_scale))
    tr.add_argument("--think-time-cap", type=float, metavar="S",
                    help="cap think times and subagent gaps (seconds)" + scaled(SCALE.think_time_cap))
    tr.add_argument("--vocab-size", type=int, metavar="N", help="synthesized token ids lie in [offset, offset+size) "
                    "(default: 256 byte ids for our server, else 30000)")
    tr.add_argument("--vocab-offset", type=int, metavar="ID",
                    help="lowest synthesized token id (default: 0 for our server, else 1000)")
    if http:
        # `loadgen bench` takes these from the engine's own --speculative-config/--golden-al/--thinking.
        spec = p.add_argument_group("speculative decoding (expected acceptance length)")
        spec.add_argument("--golden-al", metavar="NAME|FILE|PREFIX",
                          help="golden AL curve (bundled name, see `loadgen golden-al list`, a YAML file[:MODEL], or "
                          "an InferenceX model prefix such as dsv4, which selects that model's curve strictly): each "
                          "request expects the curve's AL at --spec-k for its thinking mode; sent per request "
                          "as `acceptance_length` only to our server, recorded beside the measured AL always")
        spec.add_argument("--spec-k", type=int, metavar="K",
                          help="num_speculative_tokens to read the curve at (default: our server's k)")
        spec.add_argument("--thinking", choices=THINKING_CHOICES,
                          help="curve mode: auto = per request from the trace (output_types has 'thinking'; "
                          "a mode a named curve lacks falls back to the other, with a warning; one selected by model "
                          "prefix fails instead, as in InferenceX) (default auto)")
    if http:
        # The in-process engine (`loadgen bench`) lives in its one process: no worker processes there.
        scale = p.add_argument_group("client processes")
        scale.add_argument("--workers", default=DEFAULTS.workers, metavar="N|auto",
                           help="client processes: the lanes (closed loop) or arrivals (open loop) are split "
                           "across N processes, each with its own event loop and connections; the same seed "
                           "sends the same requests whatever N; auto: enough for the load at a measured "
                           f"per-core capacity, at most the CPU count (default {DEFAULTS.workers})")
        scale.add_argument("--ray", metavar="auto|ADDRESS",
                           help="place the workers as Ray actors spread over a Ray cluster's nodes (auto: the "
                           "running cluster, else a local one for the run; ADDRESS: that cluster's head); needs "
                           "`pip install agentload[ray]`")
    out = p.add_argument_group("output")
    out.add_argument("--out", metavar="DIR", help="results folder (default results/<UTC timestamp>/)")
    out.add_argument("--per-request", metavar="FILE.jsonl", help="also write one JSON line per request")
    out.add_argument("--quiet", action="store_true",
                     help="no tables or progress, only errors (progress: in place on a terminal, else a line "
                     f"every {DEFAULTS.piped_progress_interval_s:g} s)")


def set_submission_defaults(p: argparse.ArgumentParser) -> None:
    """Keep the parser's defaults of the flags --submission sets: it sets only the ones left at them."""
    from loadgen.run.validity import submission_flags

    p.set_defaults(submission_defaults={dest: p.get_default(dest) for dest in submission_flags()})


def add_slo_flags(p: argparse.ArgumentParser) -> None:
    """--slo and --attainment: what every level's attainment and goodput are reported against."""
    from loadgen.results.slo import TIERS

    tiers = "; ".join(f"{name}: {bounds}" for name, bounds in TIERS.items())
    group = p.add_argument_group("service-level objectives")
    group.add_argument("--slo", action="append", metavar="TIER|BOUNDS",
                       help="an SLO every level reports attainment and goodput against (repeatable): a tier name, "
                       "per-request bounds such as 'ttft<=2s,interactivity>=50' on ttft, tpot, e2el, norm_e2el "
                       "(<= with s, ms or us) and interactivity (>= tok/s/user), or NAME=BOUNDS. "
                       f"Tiers: {tiers} (default: every tier; `loadgen capacity` searches the first, default standard)")
    group.add_argument("--attainment", type=float, default=DEFAULTS.attainment, metavar="F",
                       help="the share of a level's requests that must be good for it to hold an SLO "
                       f"(default {DEFAULTS.attainment:g})")


def run(args: argparse.Namespace) -> int:
    from loadgen.run.replay import replay_main

    return replay_main(args)
