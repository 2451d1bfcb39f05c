"""GPU check and timing of the Gluon sparse-MLA kernel (kernels/sparse_mla_gluon.py) against the Triton
kernel and the torch reference, on an sm_90 GPU (H100, H200; on gfx942 the same checks and timings
run the AMD kernel, which has not been run there yet). Not run by CI.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/gluon_sparse_mla.py --json $OUT/gluon_sparse_mla.json

Checks first: every candidate config (CANDIDATE_CONFIGS) on bf16 and fp8_ds_mla rows, at 16, 20
and 128 heads, for decode (1 to 64 query tokens), speculative verification (5 tokens, a short
index list) and prefill token counts, with -1 indices (a token with none, a token with a third,
scattered ones), index lists that are not a multiple of the tiles, whole and split lists. Each
must meet the tests' bars (tests/kernels/checks.py) against the torch reference and against the
Triton kernel, with outputs poisoned beforehand, and give the same bits twice. A variant that
does not compile or launch is reported and the others go on. Any FAIL ends the run with exit
status 1 before timing (--keep-going times anyway, still exiting 1). A step that makes no progress
for --hang-seconds (a deadlocked kernel) ends the run with exit status 3 and names the step; the
JSON is written after the checks and again at the end.

Then the issue's target shapes are timed, Gluon (each candidate config) and Triton (its default
tiles) interleaved round by round, each a triton.testing.do_bench median over three input sets
(benchmarks/kernels.py's bench: L2 flushed, random slots over --kv-slots rows), the median over
the rounds reported with TFLOP/s and GB/s by benchmarks/kernels.py's work model and the fractions
of the copy bandwidth and bf16 matmul rate measured on the device at the start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
sys.path.append(str(_ROOT / "benchmarks"))  # after the root: `kernels` stays the package
from kernels_module import kernels_benchmark  # noqa: E402

bk = kernels_benchmark()

from kernels.sparse_mla import sparse_mla_torch, sparse_mla_triton  # noqa: E402
from kernels.sparse_mla_gluon import (  # noqa: E402
    CANDIDATE_CONFIGS,
    CDNA3,
    GluonAmdConfig,
    GluonMlaConfig,
    gluon_target,
    gluon_unavailable_reason,
    sparse_mla_gluon,
)
from kernels.triton_utils import poisoned_outputs  # noqa: E402
from tests.kernels.checks import assert_mla_match, calc_diff  # noqa: E402

D_C, D_R, SCALE = bk.D_C, bk.D_R, bk.SCALE
KV_DTYPES = ("bf16", "fp8_ds_mla")
CHECK_SLOTS = 1 << 16  # cache rows of the check cases: tokens share rows, as a prompt's do


class Watchdog:
    """Ends the process (exit status 3) when the step now running makes no progress for `seconds`: a
    kernel that deadlocks (a barrier phase never completes) would otherwise hold the GPU until the
    caller's time limit. The GPU work dies with the process."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.step, self.since = seconds, "start", time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def enter(self, step: str) -> None:
        self.step, self.since = step, time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            if time.monotonic() - self.since > self.seconds:
                print(f"TIMEOUT: {self.step} made no progress for {self.seconds:.0f} s (a deadlocked kernel?)",
                      flush=True)
                os._exit(3)


WATCHDOG: Watchdog | None = None


def step(label: str) -> None:
    if WATCHDOG is not None:
        WATCHDOG.enter(label)


@dataclass(frozen=True)
class CheckCase:
    name: str
    tokens: int
    heads: int
    topk: int
    splits: int | None  # None: the launcher's automatic count
    quick: bool  # part of --quick


CHECK_CASES = (
    CheckCase("decode T1 H128", 1, 128, 2048, None, True),
    CheckCase("decode T3 H16 K2000", 3, 16, 2000, None, True),
    CheckCase("decode T64 H128", 64, 128, 2048, None, True),
    CheckCase("decode T64 H16 split 8", 64, 16, 2048, 8, True),
    CheckCase("verify T5 H128 K81 split 3", 5, 128, 81, 3, True),
    CheckCase("odd heads T4 H20 K300", 4, 20, 300, None, False),
    CheckCase("more splits than tiles T2 H16 K100 split 6", 2, 16, 100, 6, False),
    CheckCase("prefill T512 H128", 512, 128, 2048, None, True),
    CheckCase("prefill T4096 H128 K2048", 4096, 128, 2048, None, False),
    CheckCase("prefill T4096 H16 K1999", 4096, 16, 1999, None, False),
)


@dataclass(frozen=True)
class TimeCase:
    name: str
    tokens: int
    heads: int
    kv_dtype: str
    quick: bool


TIME_CASES = (  # issue 43's targets
    TimeCase("prefill T4096 H128 bf16", 4096, 128, "bf16", True),
    TimeCase("decode B64 H128 fp8", 64, 128, "fp8_ds_mla", True),
    TimeCase("decode B128 H128 fp8", 128, 128, "fp8_ds_mla", False),
    TimeCase("decode B64 H16 bf16", 64, 16, "bf16", True),
    TimeCase("decode B64 H16 fp8", 64, 16, "fp8_ds_mla", True),
    TimeCase("decode B128 H16 bf16", 128, 16, "bf16", False),
    TimeCase("decode B128 H16 fp8", 128, 16, "fp8_ds_mla", False),
    TimeCase("decode B64 H128 bf16", 64, 128, "bf16", False),
    TimeCase("prefill T4096 H128 fp8", 4096, 128, "fp8_ds_mla", False),
)


def configs(kv_dtype: str, quick: bool) -> tuple[GluonMlaConfig | GluonAmdConfig, ...]:
    """The Gluon configs to check and time on this device: Hopper's candidates (the default alone
    with --quick), or the gfx942 kernel's one."""
    if gluon_target(torch.device("cuda")) == CDNA3:
        return (GluonAmdConfig(),)
    return CANDIDATE_CONFIGS[kv_dtype][:1] if quick else CANDIDATE_CONFIGS[kv_dtype]


def config_label(cfg: GluonMlaConfig | GluonAmdConfig) -> str:
    if isinstance(cfg, GluonAmdConfig):
        return f"gluon gfx942 n{cfg.block_n}"
    return f"gluon n{cfg.block_n} s{cfg.num_stages} loader {cfg.loader_warps}w/{cfg.loader_regs}r"


def check_indices(tokens: int, topk: int, num_slots: int) -> torch.Tensor:
    """Random slots with -1s: token 0 has none valid and token 1 a third (when there are two or more
    tokens), and about 3% are scattered -1s."""
    idx = torch.randint(0, num_slots, (tokens, topk), device="cuda", dtype=torch.int32)
    idx[torch.rand(tokens, topk, device="cuda") < 0.03] = -1
    if tokens >= 2:
        idx[0] = -1
        idx[1, topk // 3:] = -1
    return idx


def check_one(q, cache, idx, kv_dtype, splits, cfg, ref, tri) -> tuple[bool, str]:
    """(passed, what was found) for one variant's output against the reference and the Triton kernel."""
    with poisoned_outputs():
        out, lse = sparse_mla_gluon(q[..., :D_C], q[..., D_C:], cache, idx, SCALE, kv_dtype, splits, cfg)
        again = sparse_mla_gluon(q[..., :D_C], q[..., D_C:], cache, idx, SCALE, kv_dtype, splits, cfg)
    torch.cuda.synchronize()
    problems = []
    for against, (r_out, r_lse) in (("torch", ref), ("triton", tri)):
        try:
            assert_mla_match(out, lse, r_out, r_lse)
        except AssertionError as exc:
            problems.append(f"vs {against}: {str(exc).splitlines()[0] if str(exc) else 'a bar is exceeded'}")
    if not (torch.equal(out, again[0]) and torch.equal(lse, again[1])):
        problems.append("two runs differ")
    o, r = out.float(), ref[0].float()
    finite = torch.isfinite(ref[1])
    lse_err = float((lse[finite] - ref[1][finite]).abs().max()) if finite.any() else 0.0
    found = (f"max|o-ref| {float((o - r).abs().nan_to_num(1e9).max()):.1e} diff {calc_diff(o.nan_to_num(), r):.1e} "
             f"lse err {lse_err:.1e}")
    return not problems, found + ("" if not problems else " | " + "; ".join(problems))


def run_checks(quick: bool) -> list[dict]:
    results = []
    for kv_dtype in KV_DTYPES:
        cache = bk.make_kv_cache(CHECK_SLOTS, kv_dtype)
        for case in (c for c in CHECK_CASES if c.quick or not quick):
            q = torch.randn(case.tokens, case.heads, D_C + D_R, device="cuda").bfloat16()
            idx = check_indices(case.tokens, case.topk, CHECK_SLOTS)
            step(f"references of {case.name} {kv_dtype}")
            ref = sparse_mla_torch(q, cache, idx, SCALE, D_C, kv_dtype)
            tri = sparse_mla_triton(q[..., :D_C], q[..., D_C:], cache, idx, SCALE, kv_dtype, case.splits)
            for cfg in configs(kv_dtype, quick):
                label = f"{case.name} {kv_dtype} {config_label(cfg)}"
                step(f"check {label}")
                try:
                    passed, found = check_one(q, cache, idx, kv_dtype, case.splits, cfg, ref, tri)
                except Exception as exc:  # a variant that does not compile or launch hides no other
                    passed, found = False, f"{type(exc).__name__}: {str(exc)[-1500:]}"
                print(f"{'PASS' if passed else 'FAIL'} {label}: {found}", flush=True)
                results.append({"case": label, "passed": passed, "found": found})
        del cache
        torch.cuda.empty_cache()
    return results


def time_case(case: TimeCase, num_slots: int, rounds: int, quick: bool, ceilings: tuple[float, float]) -> list[dict]:
    cache = bk.make_kv_cache(num_slots, case.kv_dtype)
    sets = [(torch.randn(case.tokens, case.heads, D_C + D_R, device="cuda").bfloat16(),
             torch.randint(0, num_slots, (case.tokens, bk.TOPK), device="cuda", dtype=torch.int32))
            for _ in range(3)]
    sides = {"triton (default tiles)": [lambda q=q, i=i: sparse_mla_triton(
        q[..., :D_C], q[..., D_C:], cache, i, SCALE, case.kv_dtype) for q, i in sets]}
    for cfg in configs(case.kv_dtype, quick):
        sides[config_label(cfg)] = [lambda q=q, i=i, cfg=cfg: sparse_mla_gluon(
            q[..., :D_C], q[..., D_C:], cache, i, SCALE, case.kv_dtype, None, cfg) for q, i in sets]
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):  # interleaved: drift of the machine hits every side alike
        for name, fns in sides.items():
            step(f"timing {case.name} {name}")
            try:
                times[name].append(bk.bench(fns))
            except Exception as exc:
                print(f"{case.name} {name}: {type(exc).__name__}: {str(exc)[-500:]}", flush=True)
    flops, nbytes = bk.sparse_mla_work(case.tokens, case.heads, case.kv_dtype)
    triton_ms = statistics.median(times["triton (default tiles)"]) if times["triton (default tiles)"] else None
    rows = []
    for name, ms_list in times.items():
        if not ms_list:
            continue
        ms = statistics.median(ms_list)
        tflops, gbps = flops / ms / 1e9, nbytes / ms / 1e6
        rows.append({"case": case.name, "kernel": name, "us": ms * 1e3, "rounds_us": [m * 1e3 for m in ms_list],
                     "tflops": tflops, "gbps": gbps, "frac_copy": gbps / (ceilings[0] * 1e3),
                     "frac_matmul": tflops / ceilings[1], "vs_triton": triton_ms / ms if triton_ms else None})
        print(f"{case.name:<26} {name:<34} {ms * 1e3:>9.1f} us {tflops:>7.1f} TFLOP/s {gbps:>6.0f} GB/s "
              f"{100 * rows[-1]['frac_copy']:>4.0f}% copy {100 * rows[-1]['frac_matmul']:>4.0f}% mm "
              f"{'' if triton_ms is None else f'{triton_ms / ms:.2f}x triton'}", flush=True)
    return rows


def compiled_variants() -> list[dict]:
    """Registers, spills and shared memory of each Gluon variant this run compiled."""
    from kernels.sparse_mla_gluon_kernel import sparse_mla_fwd_kernel

    found = []
    for cache in sparse_mla_fwd_kernel.device_caches.values():
        for compiled in cache[0].values():
            try:
                compiled._init_handles()
                names = compiled.src.fn.arg_names
                found.append({"constexprs": {names[k[0]]: str(v) for k, v in compiled.src.constants.items()},
                              "n_regs": compiled.n_regs, "n_spills": compiled.n_spills,
                              "shared": compiled.metadata.shared})
            except Exception as exc:  # the inspection is a report, never a failure
                found.append({"error": f"{type(exc).__name__}: {exc}"})
    return found


def git_commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True)
    return run.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the checks and timings here")
    parser.add_argument("--quick", action="store_true", help="fewer cases, the default configs only, one round")
    parser.add_argument("--keep-going", action="store_true", help="time even after a failed check (exit 1 anyway)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (--quick: 1)")
    parser.add_argument("--kv-slots", type=int, default=1 << 20, help="cache rows the timed indices draw from")
    parser.add_argument("--hang-seconds", type=float, default=180.0,
                        help="end the run (exit 3) when one step (a compile and check, a timing) takes longer")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or (reason := gluon_unavailable_reason(torch.device("cuda"))) is not None:
        print(f"benchmarks/gluon_sparse_mla.py needs a GPU a Gluon kernel is written for: "
              f"{'no CUDA device' if not torch.cuda.is_available() else reason}", file=sys.stderr)
        return 2
    global WATCHDOG
    WATCHDOG = Watchdog(args.hang_seconds)
    device = torch.cuda.get_device_name()
    print(f"device: {device}  torch {torch.__version__}  triton {triton.__version__}  commit {git_commit()}",
          flush=True)
    torch.manual_seed(0)
    report: dict = {"device": device, "torch": torch.__version__, "triton": triton.__version__,
                    "commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "configs": {d: [asdict(c) for c in configs(d, args.quick)] for d in KV_DTYPES}}
    checks = run_checks(args.quick)
    failed = [c["case"] for c in checks if not c["passed"]]
    report.update(checks=checks, failed=failed, compiled=compiled_variants())
    print(f"checks: {len(checks) - len(failed)} passed, {len(failed)} failed", flush=True)
    for variant in report["compiled"]:
        print("compiled:", variant)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if not failed or args.keep_going:
        step("measuring the ceilings")
        copy_tbps, mm_tflops = bk.measure_ceilings()
        print(f"ceilings measured now: copy {copy_tbps:.2f} TB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s", flush=True)
        report["ceilings"] = {"copy_tbps": copy_tbps, "matmul_tflops": mm_tflops}
        rounds = 1 if args.quick else args.rounds
        report["timings"] = [row for case in TIME_CASES if case.quick or not args.quick
                             for row in time_case(case, args.kv_slots, rounds, args.quick, (copy_tbps, mm_tflops))]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
