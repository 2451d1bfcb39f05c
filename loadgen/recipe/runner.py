"""`loadgen recipe run`: every variant's runs, interleaved, into one results folder; resumable.

Order: `sweep.repeats` rounds; each round runs every variant once, in the orders of a Williams
design (`round_orders`: A B, B A, ...; A B C, B C A, C A B, C B A, A C B, B A C, ...): every
variant runs in every position, and right after every other variant, equally often over a full
cycle of orders. Slow drift of the machine falls on all variants alike, none always runs first
or last in its round, and what a run leaves behind on the host (a warm or idle CPU, a loaded
page cache) does not always fall on the same successor, as it would with a plain rotation
(loadgen compare pairs round k of each variant). With `sweep.servers: fresh` (the default) each run starts the
variant's server afresh (cold caches, the same seed, no state carried from the previous run),
runs the whole sweep with `loadgen replay` (or `loadgen bench` for the in-process engine) - the
commands' own entry points, as a user would call them - and stops the server's process group.
With `kept`, every variant's server is started once, side by side, before the first run and
stopped after the last (a server start can take minutes on a GPU, and runs then follow each
other with no gap); round k replays seed + k - 1, so no earlier round's prompt is cached.

Folder:
    recipe.yaml                  the recipe as run (a resume must match it)
    runs/<variant>-r<k>/         result.json of the k-th round (with its launch record:
                                 loadgen/recipe/provenance.py), replay.log, server.log (fresh)
    servers/<variant>.log        the kept server's log (kept)
    compare/<variant>-vs-<baseline>.txt|.json   loadgen compare of all rounds of both
    report/                      Pareto and percentile PNGs of every run on shared axes, report.html

A run counts as finished when its result.json says "complete"; `--resume` skips finished runs
and redoes the others (an interrupted or crashed run is discarded whole).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadgen.recipe.memory import split_note
from loadgen.recipe.provenance import launch_record, stamp_launch
from loadgen.recipe.schema import (
    CapacityMeasure,
    Recipe,
    RecipeError,
    Variant,
    recipe_from_dict,
    to_dict,
    to_yaml,
)
from loadgen.recipe.server import RunningServer, ServerStartError, flag_args, stop_group
from loadgen.run.affinity import placed_on

REPLAY_STOP_GRACE_S = 10.0


class RecipeRunError(RuntimeError):
    """A run that cannot go on (bad workload flags, a server that never became healthy)."""


@dataclass(frozen=True, slots=True)
class PlannedRun:
    round: int  # 1-based
    variant: Variant

    @property
    def name(self) -> str:
        return f"{self.variant.name}-r{self.round}"


def round_orders(n: int) -> list[list[int]]:
    """A Williams design for n variants: n orders (2n for odd n) in which each variant takes each
    position equally often and directly follows each other variant equally often."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(v + shift) % n for v in first] for shift in range(n)]
    return orders + [order[::-1] for order in orders] if n % 2 else orders


def plan(recipe: Recipe) -> list[PlannedRun]:
    """Rounds of all variants, round r in order r of the Williams design (cycling): A-r1, B-r1, B-r2, A-r2, ..."""
    variants, orders = recipe.variants, round_orders(len(recipe.variants))
    rounds = range(1, recipe.sweep.repeats + 1)
    return [PlannedRun(r, variants[i]) for r in rounds for i in orders[(r - 1) % len(orders)]]


def verdict_design(recipe: Recipe) -> str:
    """One line on how the verdicts will be drawn and how sensitive they are (README, Calibration)."""
    rounds, n = recipe.sweep.repeats, len(recipe.variants)
    compare = recipe.compare
    runs = f"{rounds} run{'s' if rounds > 1 else ''} per variant"
    if n < 2:
        return "verdicts: none (one variant: nothing to compare it with)"
    if recipe.sweep.capacity is not None:
        if rounds < 2:
            return "verdicts: none on capacity from one round (repeats >= 3: each round's capacities are one pair)"
        return (f"verdicts: capacity under {recipe.sweep.capacity.slo}, {rounds} rounds paired"
                f"{' as blocks of ' + str(n) + ' variants' if n > 2 else ''}, t on {(rounds - 1) * (n - 1)} df "
                "with the search's resolution as a noise floor")
    if compare.run_noise:
        return f"verdicts: {runs} against the A/A prior {compare.run_noise}"
    if rounds < 2:
        return ("verdicts: one run per side, session bootstrap - the run-to-run noise is not in the "
                "interval (README, Calibration: about a third of A/A metrics flagged); use repeats >= 3")
    if not compare.paired:
        return f"verdicts: Welch t over {runs} (compare.paired: false)"
    df = (rounds - 1) * (n - 1)
    text = f"verdicts: {rounds} rounds {'as blocks of ' + str(n) + ' variants' if n > 2 else 'paired'}, t on {df} df"
    if n == 2 and not any(v.control for v in recipe.variants):
        text += (f"; two variants find a 10 % change only at a small run noise (about 2.5 % at 5 rounds) - a "
                 f"`control: true` copy of the baseline adds {rounds - 1} df and measures that noise")
    return text


def load_command(recipe: Recipe, variant: Variant, url: str | None, out: Path, quiet: bool,
                 round_: int = 1) -> list[str]:
    """The `loadgen replay` (HTTP) or `loadgen bench` (in-process) argv of one run of round `round_`."""
    sweep, work = recipe.sweep, recipe.workload
    args = ["--duration", f"{sweep.duration_s:g}", "--warmup", sweep.warmup, "--seed", str(sweep.seed_of(round_)),
            "--token-scale", f"{work.token_scale:g}", "--think-time-scale", f"{work.think_time_scale:g}",
            "--out", str(out)]
    tiers = dict(recipe.slos)
    if sweep.capacity is not None:
        args += capacity_flags(sweep.capacity, tiers)
    elif sweep.conc:
        args += ["--conc", ",".join(map(str, sweep.conc))]
    else:
        assert sweep.rates is not None  # validate(): exactly one of sweep.conc, sweep.rates and sweep.capacity
        args += ["--rate", ",".join(f"{r:g}" for r in sweep.rates)]
    if sweep.capacity is None:
        for name, bounds in recipe.slos:  # the recipe's own tiers beside the replay's
            args += ["--slo", f"{name}={bounds}"]
    optional = {"traces": work.traces, "think_time_cap": work.think_time_cap, "max_context": work.max_context,
                "timeout": work.timeout_s, "gpus": recipe.server.gpus}
    if url is not None:
        optional.update(url=url, endpoint=work.endpoint, model=work.model, golden_al=work.golden_al,
                        spec_k=work.spec_k, thinking=work.thinking)
    args += flag_args({k: v for k, v in optional.items() if v is not None})
    if quiet:
        args.append("--quiet")
    if url is None:
        capacity = ["--capacity"] if sweep.capacity is not None else []
        return [sys.executable, "-m", "loadgen.cli", "bench", *flag_args(recipe.server_flags(variant)), *args,
                *capacity, "--no-report"]
    command = "capacity" if sweep.capacity is not None else "replay"
    return [sys.executable, "-m", "loadgen.cli", command, *args]


def capacity_flags(measure: CapacityMeasure, tiers: dict[str, str]) -> list[str]:
    """The search's flags of `loadgen capacity` / `bench --capacity` for a recipe's sweep.capacity."""
    slo = f"{measure.slo}={tiers[measure.slo]}" if measure.slo in tiers else measure.slo
    args = ["--slo", slo, "--attainment", f"{measure.attainment:g}", "--over", measure.over,
            "--resolution", f"{measure.resolution:g}", "--max-probes", str(measure.max_probes)]
    bounds = {key: value for key, value in (("low", measure.low), ("high", measure.high)) if value is not None}
    return args + flag_args({**bounds, "open_loop": measure.open_loop, "no_early_stop": not measure.early_stop})


class RecipeRun:
    def __init__(self, recipe: Recipe, out: Path, resume: bool, quiet: bool) -> None:
        self.recipe, self.out, self.quiet = recipe, out, quiet
        self.runs = plan(recipe)
        self._prepare_folder(resume)

    def _prepare_folder(self, resume: bool) -> None:
        saved = self.out / "recipe.yaml"
        if resume:
            if not saved.exists():
                raise RecipeError(f"--resume: {self.out} holds no recipe.yaml; nothing to resume")
            import yaml

            if to_dict(recipe_from_dict(yaml.safe_load(saved.read_text()), str(saved))) != to_dict(self.recipe):
                raise RecipeError(f"--resume: {saved} is a different recipe; resume with the same file, or "
                                  f"choose another --out")
        elif self.out.exists() and any(self.out.iterdir()):
            raise RecipeError(f"--out: {self.out} exists and is not empty; give --resume to continue it, or "
                              f"another folder")
        (self.out / "runs").mkdir(parents=True, exist_ok=True)
        saved.write_text(to_yaml(self.recipe))

    def finished(self, run: PlannedRun) -> bool:
        path = self.out / "runs" / run.name / "result.json"
        if not path.exists():
            return False
        import orjson

        try:
            return orjson.loads(path.read_bytes()).get("status") == "complete"
        except orjson.JSONDecodeError:
            return False

    def run(self) -> int:
        """Every unfinished run, then the comparisons and the report; the exit code."""
        todo = [r for r in self.runs if not self.finished(r)]
        self._say(verdict_design(self.recipe))
        if len(todo) < len(self.runs):
            self._say(f"resuming: {len(self.runs) - len(todo)} of {len(self.runs)} runs already finished")
        started = time.monotonic()
        worst = 0
        kept: dict[str, RunningServer] = {}
        try:
            if todo and self.recipe.sweep.servers == "kept":
                note = split_note(self.recipe)
                if note:
                    self._say(note)
                kept = self._start_kept({run.variant.name: run.variant for run in todo})
            for number, run in enumerate(todo, start=1):
                self._say(f"[{number}/{len(todo)}] {run.name}: starting "
                          f"({time.monotonic() - started:.0f} s into the recipe)")
                worst = max(worst, self._one(run, kept.get(run.variant.name)))
        finally:
            for server in kept.values():
                server.stop()
        self._say(f"all {len(self.runs)} runs finished; comparing and writing the report")
        from loadgen.recipe.outputs import write_outputs

        for path in write_outputs(self.recipe, self.out, [(r.variant.name, r.name) for r in self.runs]):
            self._say(f"wrote {path}")
        return worst

    def _start_kept(self, variants: dict[str, Variant]) -> dict[str, RunningServer]:
        """Every variant's server, started one after another (so they do not slow each other's
        start) and healthy; all of them stopped again if one fails."""
        (self.out / "servers").mkdir(exist_ok=True)
        servers: dict[str, RunningServer] = {}
        try:
            for name, variant in variants.items():
                log_path = self.out / "servers" / f"{name}.log"
                if log_path.exists():  # a resume: keep the last start's log (a crash's reason) beside
                    log_path.replace(log_path.with_suffix(".log.previous"))
                servers[name] = RunningServer(self.recipe, variant, log_path)
                self._start(servers[name])
        except BaseException:
            for server in servers.values():
                server.stop()
            raise
        return servers

    def _start(self, server: RunningServer) -> str:
        began = time.monotonic()
        try:
            url = server.start()
        except ServerStartError as exc:
            raise RecipeRunError(f"variant {server.variant.name}: {exc}") from None
        self._say(f"  {server.variant.name}: server healthy at {url} after {time.monotonic() - began:.1f} s")
        return url

    def _one(self, run: PlannedRun, kept: RunningServer | None) -> int:
        folder = self.out / "runs" / run.name
        shutil.rmtree(folder, ignore_errors=True)  # a partial run from an interruption is redone whole
        folder.mkdir(parents=True)
        server = kept or RunningServer(self.recipe, run.variant, folder / "server.log")
        url = None
        if kept is not None:
            if kept.process is not None and kept.process.poll() is not None:
                raise RecipeRunError(f"variant {run.variant.name}: its kept server exited with code "
                                     f"{kept.process.returncode}; see {kept.log_path}; `--resume` starts it again")
            url = kept.url
        elif self.recipe.server.kind != "inprocess":
            url = self._start(server)
        command = load_command(self.recipe, run.variant, url, folder, self.quiet, run.round)
        try:
            code = self._load(command, folder)
        finally:
            if kept is None:
                server.stop()
        if code == 2:
            raise RecipeRunError(f"{run.name}: the load command rejected its input (exit 2); see "
                                 f"{folder / 'replay.log'}")
        if not self.finished(run):
            raise RecipeRunError(f"{run.name}: did not finish (exit {code}); see {folder / 'replay.log'} and "
                                 f"{server.log_path}; `--resume` redoes it")
        stamp_launch(folder / "result.json",
                     launch_record(self.recipe, run.variant, run.round, server.command, url))
        self._say(f"  {run.name}: finished (exit {code})")
        return code

    def _load(self, command: list[str], folder: Path) -> int:
        """Run the load command in its own process group, its output teed to replay.log."""
        (folder / "command.txt").write_text(" ".join(command) + "\n")
        with open(folder / "replay.log", "wb") as sink:
            with placed_on(self.recipe.sweep.client_cpu_set()):
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            try:
                assert process.stdout is not None  # stdout=PIPE
                for line in process.stdout:
                    sink.write(line)
                    if not self.quiet:
                        sys.stdout.write("  | " + line.decode(errors="replace"))
                        sys.stdout.flush()
                return process.wait()
            finally:
                if process.poll() is None:
                    stop_group(process, REPLAY_STOP_GRACE_S)

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"recipe {self.recipe.name}: {text}", flush=True)
