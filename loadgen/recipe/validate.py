"""A recipe's cross-field rules (`validate_recipe`, run as every Recipe is built): what the types
of loadgen/recipe/schema.py cannot say alone, e.g. that a command server names where its port
goes, that exactly one of sweep.conc, sweep.rates and sweep.capacity is given, or that a variant
overrides something. Every error is a RecipeError naming the key."""

from __future__ import annotations

import re
from typing import Any

from loadgen.recipe.schema import PORT_PLACEHOLDER, Recipe, RecipeError
from loadgen.results.metric_registry import STATISTIC_BY_NAME
from loadgen.results.slo import SloError, check_target, parse_slo
from loadgen.run.affinity import CpuListError

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def validate_recipe(r: Recipe) -> None:
    """Cross-field rules; raises RecipeError naming the key."""
    s = r.server
    need = {"command": "command", "url": "url"}.get(s.kind)
    for key in ("command", "url"):
        if key == need:
            _require(getattr(s, key), f"server.{key}: required with server.kind {s.kind}")
        else:
            _require(getattr(s, key) is None, f"server.{key}: only meaningful with server.kind {key}")
    if s.kind == "command":
        assert s.command is not None  # required above
        _require(PORT_PLACEHOLDER in s.command, f"server.command: must contain {PORT_PLACEHOLDER} where the "
                                                f"port goes, got {s.command!r}")
    if s.kind == "url":
        assert s.url is not None  # required above
        _require(s.url.startswith(("http://", "https://")), f"server.url: expected http(s)://HOST:PORT, got {s.url!r}")
        _require(not s.flags and not s.env, "server.flags/env: a running server at a URL cannot be given flags")
    _require(s.startup_timeout_s > 0, f"server.startup_timeout_s: must be positive, got {s.startup_timeout_s:g}")
    _require(s.health_path.startswith("/"), f"server.health_path: must start with /, got {s.health_path!r}")
    _require(s.gpus is None or s.gpus >= 1, f"server.gpus: must be >= 1, got {s.gpus}")
    for key in ("cpus", "cwd"):
        _require(getattr(s, key) is None or s.kind in ("ours", "command"),
                 f"server.{key}: only for a server the recipe starts (kind ours or command), not kind {s.kind}")
    _require(s.cwd != "", "server.cwd: empty; leave it out for loadgen's own directory")
    try:
        s.cpu_set(), r.sweep.client_cpu_set()
    except CpuListError as exc:
        raise RecipeError(str(exc)) from None
    sw = r.sweep
    _require(sum(x is not None for x in (sw.conc, sw.rates, sw.capacity)) == 1,
             "sweep: give exactly one of sweep.conc, sweep.rates and sweep.capacity")
    if sw.capacity is None:
        levels = sw.conc if sw.conc is not None else (sw.rates or ())
        key = "sweep.conc" if sw.conc is not None else "sweep.rates"
        _require(bool(levels) and all(v > 0 for v in levels), f"{key}: expected a non-empty list of positive numbers")
    _validate_slos(r)
    _require(sw.duration_s > 0, f"sweep.duration_s: must be positive, got {sw.duration_s:g}")
    _require(sw.repeats >= 1, f"sweep.repeats: must be >= 1, got {sw.repeats}")
    _require(sw.warmup.endswith(("s", "req")), f"sweep.warmup: expected '30s' or '2req', got {sw.warmup!r}")
    _require(sw.servers == "fresh" or s.kind in ("ours", "command"),
             f"sweep.servers: kept needs servers the recipe starts (server.kind ours or command), not {s.kind}")
    w = r.workload
    _require(w.token_scale > 0, f"workload.token_scale: must be positive, got {w.token_scale:g}")
    # as `loadgen replay`: 0 takes the recorded think time out (the server's capacity on the sessions)
    _require(w.think_time_scale >= 0, f"workload.think_time_scale: must be >= 0, got {w.think_time_scale:g}")
    _require(w.thinking is None or w.golden_al is not None,
             "workload.thinking: only meaningful with workload.golden_al")
    _require(0 < r.compare.fdr < 1, f"compare.fdr: must be in (0, 1), got {r.compare.fdr:g}")
    for i, name in enumerate(r.compare.metrics or ()):
        _require(name in STATISTIC_BY_NAME,
                 f"compare.metrics[{i}]: unknown metric {name!r}; known: {', '.join(STATISTIC_BY_NAME)}")

    _require(bool(r.variants), "variants: need at least one (the first is the baseline)")
    names = [v.name for v in r.variants]
    for i, v in enumerate(r.variants):
        where = f"variants[{i}] ({v.name})"
        _require(bool(v.name) and v.name.replace("-", "").replace("_", "").replace(".", "").isalnum(),
                 f"variants[{i}].name: letters, digits, '-', '_' and '.' only, got {v.name!r}")
        _require(v.name not in names[:i], f"variants[{i}].name: {v.name!r} is used twice")
        if s.kind == "url":
            _require(not v.flags and not v.env, f"{where}.flags: a server at a URL cannot be given flags")
        _require(v.cwd is None or s.kind in ("ours", "command"),
                 f"{where}.cwd: only for a server the recipe starts (kind ours or command), not kind {s.kind}")
        _require(v.cwd != "", f"{where}.cwd: empty; leave it out for the server's (server.cwd, or loadgen's)")
        if i == 0:
            _require(not v.control, f"{where}.control: the first variant is the baseline itself")
            continue
        if v.control:
            _require(not v.flags and not v.env and v.cwd is None,
                     f"{where}.control: a control copies the baseline; drop its flags/env/cwd")
        else:
            _require(r.server_key(v) != r.server_key(r.variants[0]),
                     f"{where}: overrides nothing (same server flags, env and cwd as the baseline); give a "
                     f"flag, env or cwd that differs, or `control: true` for a deliberate A/A copy")


def _validate_slos(r: Recipe) -> None:
    """The recipe's own tiers and the capacity's SLO parse; the search's settings are in range."""
    tiers = dict(r.slos)
    for name, bounds in r.slos:
        _require(_NAME.match(name) is not None, f"slos.{name}: a tier's name is letters, digits, '_', '-' or '.'")
        try:
            parse_slo(bounds, name=name)
        except SloError as exc:
            raise RecipeError(f"slos.{name}: {exc}") from None
    cap = r.sweep.capacity
    if cap is None:
        return
    try:
        parse_slo(cap.slo, tiers)
        check_target(cap.attainment, "sweep.capacity.attainment")
    except SloError as exc:
        raise RecipeError(f"sweep.capacity.slo: {exc}" if "attainment" not in str(exc) else str(exc)) from None
    for key in ("low", "high"):
        value = getattr(cap, key)
        _require(value is None or value > 0, f"sweep.capacity.{key}: must be > 0, got {value}")
    _require(cap.low is None or cap.high is None or cap.low <= cap.high,
             f"sweep.capacity.high: {cap.high} is below sweep.capacity.low {cap.low}")
    _require(0 < cap.resolution < 1, f"sweep.capacity.resolution: must be in (0, 1), got {cap.resolution:g}")
    _require(cap.max_probes >= 2, f"sweep.capacity.max_probes: need at least 2, got {cap.max_probes}")


def _require(ok: Any, message: str) -> None:
    if not ok:
        raise RecipeError(message)
