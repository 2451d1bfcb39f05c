"""`loadgen recipe verify RECIPE RESULTS...`: whether the results were produced by the recipe.

A reviewer's check that "the benchmarked configuration is reproducible from the published recipe":
for each results file (a result.json, or every result.json under a folder) the command lines that
ran are compared flag by flag with the ones the recipe makes for that run's variant
(loadgen/recipe/server.py, loadgen/recipe/runner.py), and every contradiction is named:

- the server's command line (the results' launch record: as a recipe run started it,
  loadgen/recipe/provenance.py, or as our server reported it to a plain `loadgen replay`,
  loadgen/run/provenance.py): a flag the recipe gives that the server ran without, with another
  value, or that the recipe does not give; the port is the one that run was given;
- the environment the recipe adds (a plain run: each variable the recipe sets, in the environment
  the server reported), and the image it names;
- the load's command line (the launch record's, else the command line the results file records):
  every flag but where it wrote and how it talked (--out, --quiet, --url, --per-request, --api-key,
  --header); its levels need only be among the recipe's (a sweep may be run a few points at a
  time), its seed one of the recipe's rounds';
- the curve's fingerprint, when nothing above explains a difference.

A results file whose launch record does not know the server's command line (another server than
ours, run without the recipe) or that has none (written before every run kept one) cannot show it:
for a server the recipe would start, that is reported too, as unverifiable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadgen.defaults import DEFAULTS as REPLAY
from loadgen.recipe.memory import memory_flags
from loadgen.recipe.provenance import LAUNCH_KEY, recipe_fingerprint
from loadgen.recipe.runner import load_command
from loadgen.recipe.schema import Recipe, Variant
from loadgen.recipe.server import flag_args, server_command

SET_BY_RECIPE = ("port",)  # the server's port: a free one, chosen for each start (also put in place of {port})
WHERE_AND_HOW = ("out", "quiet", "url", "per_request", "api_key", "header")  # load flags that do not shape it
SUBSET_LEVELS = ("conc", "rate")
FlagValues = str | bool | tuple[str | bool, ...]  # a flag's value; all of them, sorted, when it repeats


@dataclass(frozen=True)
class Verdict:
    """One results file against the recipe: which variant ran, and every contradiction found."""

    path: Path
    variant: str | None
    round: int | None
    fingerprint: str | None
    findings: tuple[str, ...]

    def describe(self) -> str:
        who = f"variant {self.variant}" if self.variant else "variant unknown"
        who += f", round {self.round}" if self.round else ""
        who += f", curve {self.fingerprint[:16]}" if self.fingerprint else ""
        head = f"{self.path} ({who}): "
        if not self.findings:
            return head + "matches the recipe"
        count = len(self.findings)
        return head + f"{count} contradiction{'s' * (count != 1)}\n" + "\n".join(f"    {f}" for f in self.findings)


def result_files(paths: list[str]) -> list[Path]:
    """Each path's result.json files: the file itself, or every result.json under a folder (sorted)."""
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        found += sorted(path.rglob("result.json")) if path.is_dir() else [path]
    return found


def verify(recipe: Recipe, path: Path, doc: dict[str, Any]) -> Verdict:
    """The contradictions between one results document and the recipe (module docstring)."""
    launch = doc.get(LAUNCH_KEY) or {}
    variant = _variant(recipe, launch)
    if variant is None:
        named = launch.get("variant")
        why = (f"the run's launch record names variant {named!r}, which the recipe does not have" if named else
               f"no launch record tells which of the recipe's {len(recipe.variants)} variants ran")
        return Verdict(path, named, launch.get("round"), launch.get("recipe_fingerprint"), (f"variant: {why}",))
    round_ = launch.get("round")
    findings = _server_findings(recipe, variant, launch) + _load_findings(recipe, variant, launch, doc, round_)
    expected = recipe_fingerprint(recipe, variant)
    ran = launch.get("recipe_fingerprint")
    if ran and ran != expected and not findings:
        findings.append(f"recipe fingerprint: the run's curve is {ran[:16]}, the recipe's {expected[:16]}: "
                        "something else that shapes the curve differs (workload, sweep settings, working directory)")
    return Verdict(path, variant.name, round_, ran or expected, tuple(findings))


def argv_flags(argv: list[str]) -> dict[str, FlagValues]:
    """`--key value`, `--key=value` and bare `--switch` of a command line as {key: value} (key with _);
    a flag given more than once (--slo, --header) keeps all its values, as a sorted tuple."""
    given: dict[str, list[str | bool]] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--") and len(token) > 2:
            name, equals, value = token[2:].partition("=")
            values = given.setdefault(name.replace("-", "_"), [])
            if equals:
                values.append(value)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values.append(argv[i + 1])
                i += 1
            else:
                values.append(True)
        i += 1
    return {key: values[0] if len(values) == 1 else tuple(sorted(values, key=str)) for key, values in given.items()}


def _variant(recipe: Recipe, launch: dict[str, Any]) -> Variant | None:
    if launch.get("variant"):
        return next((v for v in recipe.variants if v.name == launch["variant"]), None)
    return recipe.variants[0] if len(recipe.variants) == 1 else None


def _server_findings(recipe: Recipe, variant: Variant, launch: dict[str, Any]) -> list[str]:
    from server.launch import redacted

    kind = recipe.server.kind
    if kind in ("url", "inprocess"):  # nothing started: the in-process engine's flags are the load's
        return []
    server = launch.get("server")
    if not server:
        return ["server: no launch record (the results were written before every run kept one), so the "
                "server's command line cannot be checked against the recipe"]
    if server.get("argv") is None:
        return [f"server: the run's launch record does not know the server's command line "
                f"({server.get('argv_unknown') or 'not recorded'}), so it cannot be checked against the recipe"]
    port = urlsplit(server.get("url") or "").port  # the free port that run's command line was given
    expected = server_command(recipe, variant, port)
    if kind == "ours":
        expected += flag_args(memory_flags(recipe, variant))
    # the run's secrets were recorded as "***" (server/launch.py): compared so, they match when both give one
    findings = _compare("server flag", argv_flags(redacted(expected)), argv_flags(server["argv"]), SET_BY_RECIPE)
    findings += _compare_env(recipe.server_env(variant), server)
    if (recipe.server.image or None) != (server.get("image") or None):
        findings.append(f"image: the recipe names {recipe.server.image!r}, the run recorded {server.get('image')!r}")
    return findings


def _load_findings(recipe: Recipe, variant: Variant, launch: dict[str, Any], doc: dict[str, Any],
                   round_: int | None) -> list[str]:
    ran = launch.get("load_argv") or doc["config"].get("command_line") or []
    url = None if recipe.server.kind == "inprocess" else "-"
    expected = argv_flags(load_command(recipe, variant, url, Path("-"), False, round_ or 1))
    actual = argv_flags(ran)
    findings = _compare("load flag", expected, actual, WHERE_AND_HOW + SUBSET_LEVELS + ("seed",))
    for key in SUBSET_LEVELS:
        wanted = set(str(expected.get(key, "")).split(","))
        extra = [level for level in str(actual.get(key, "")).split(",") if level and level not in wanted]
        if extra:
            findings.append(f"load flag --{key}: the run measured {','.join(extra)}, which the recipe's sweep does "
                            f"not list ({expected.get(key, 'none')})")
    seeds = {str(recipe.sweep.seed_of(r)) for r in ([round_] if round_ else range(1, recipe.sweep.repeats + 1))}
    seed = str(actual.get("seed", REPLAY.seed))
    if seed not in seeds:
        findings.append(f"load flag --seed: the run's {seed} is none of the recipe's "
                        f"({', '.join(sorted(seeds))})")
    return findings


def _compare(what: str, expected: dict[str, Any], actual: dict[str, Any], ignored: tuple[str, ...]) -> list[str]:
    findings = []
    for key in sorted(set(expected) | set(actual)):
        if key in ignored or expected.get(key) == actual.get(key):
            continue
        flag = "--" + key.replace("_", "-")
        if key not in actual:
            findings.append(f"{what} {flag}: the recipe gives {_shown(expected[key])}; the run had none")
        elif key not in expected:
            findings.append(f"{what} {flag}: the run had {_shown(actual[key])}, which the recipe does not give")
        else:
            findings.append(f"{what} {flag}: the recipe gives {_shown(expected[key])}, the run had "
                            f"{_shown(actual[key])}")
    return findings


def _compare_env(expected: dict[str, str], server: dict[str, Any]) -> list[str]:
    """A recipe run's added environment must be the recipe's exactly; a plain run's server must have had each
    variable the recipe sets, as far as the environment it reported (server/launch.py) can show."""
    from server.launch import shapes_benchmark

    added = server.get("env")
    if isinstance(added, dict):
        return [f"environment {name}: the recipe sets {expected.get(name)!r}, the run had {added.get(name)!r}"
                for name in sorted(set(expected) | set(added)) if expected.get(name) != added.get(name)]
    reported = server.get("process_env")
    findings = []
    for name in sorted(expected):
        if reported is None or not (name in reported or shapes_benchmark(name)):
            why = "the server reported no environment" if reported is None else \
                "the server reports only the variables that shape a benchmark (server/launch.py)"
            findings.append(f"environment {name}: the recipe sets {expected[name]!r}; {why}, so it cannot be checked")
        elif reported.get(name) != expected[name]:
            findings.append(f"environment {name}: the recipe sets {expected[name]!r}, the run had "
                            f"{reported.get(name)!r}")
    return findings


def _shown(value: Any) -> str:
    return "it (a switch)" if value is True else repr(value)


# ---- command line ---------------------------------------------------------------------------


def register_verify(actions) -> None:
    """Add `verify` to `loadgen recipe`'s actions."""
    p = actions.add_parser(
        "verify", help="check that results were produced by the recipe, flag by flag; the review's Pareto evidence",
        description="Compare every results file's server and load command lines, environment and image with what "
        "the recipe makes for its variant, naming each flag that contradicts it; print the review's Pareto "
        "evidence per curve (points measured, invalid, on the frontier) and, with --earlier, whether these "
        "results only append points to the earlier ones. Exit 1 when a result contradicts the recipe or "
        "the re-run is not append-only.")
    p.add_argument("file", metavar="RECIPE", help="recipe YAML")
    p.add_argument("results", nargs="+", metavar="RESULTS", help="result.json files or folders holding them")
    p.add_argument("--earlier", nargs="+", default=[], metavar="RESULTS",
                   help="results of an earlier run of the recipe: check that RESULTS only append points to them")
    p.set_defaults(func=run_verify)


def run_verify(args) -> int:
    from loadgen.errors import UsageError
    from loadgen.recipe.evidence import append_only, curve_evidence, describe_evidence
    from loadgen.recipe.schema import RecipeError, load_recipe
    from loadgen.results.file import ResultsError, read_results

    try:
        recipe = load_recipe(args.file)
        results = [(path, read_results(path)) for path in result_files(args.results)]
        earlier = [(path, read_results(path)) for path in result_files(args.earlier)]
    except (RecipeError, ResultsError) as exc:
        raise UsageError(str(exc)) from None
    if not results:
        raise UsageError(f"RESULTS: no result.json in {', '.join(args.results)}")
    verdicts = [verify(recipe, path, doc) for path, doc in results]
    for verdict in verdicts:
        print(verdict.describe())
    wrong = sum(bool(v.findings) for v in verdicts)
    print(f"{args.file}: {wrong} of {len(verdicts)} result{'s' * (len(verdicts) != 1)} contradict the recipe"
          if wrong else f"{args.file}: all {len(verdicts)} results match the recipe")
    print("\nPareto evidence per curve:")
    print(describe_evidence(curve_evidence(results)))
    appended = True
    if args.earlier:
        appended, lines = append_only(earlier, results)
        print("\n" + "\n".join(lines))
    return 1 if wrong or not appended else 0
