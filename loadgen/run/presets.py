"""How the bundled agentic sessions are fitted to our engine's models: `loadgen bench` takes
every field of a preset the user did not give, `loadgen replay` against our own server takes
the trace-shaping ones (token and think-time scale, think-time cap) for the model it serves, and
`loadgen capacity` those and the window and warm-up of its probes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchPreset:
    """Replay flags that fit the bundled traces (~107k input, ~450 output tokens per request,
    think times of minutes) onto a model and device; the context cap is the engine's
    max_model_len. Only the flags the user did not give are taken from here."""

    conc: str
    duration: float
    warmup: str
    token_scale: float
    think_time_scale: float
    think_time_cap: float | None  # None: the recorded think times, uncapped


# tiny on 2 CPU cores: the sessions scaled down until a CPU engine keeps up and think times cut
# short, so that the default run finishes in a couple of minutes.
# small on one GPU: the sessions at a tenth of their length, the long tail dropped at its 32k context.
# v32 is the real-scale model (163,840-token context): the sessions at their recorded length and
# pace, only the requests beyond its context dropped.
BENCH_PRESETS = {
    "tiny": BenchPreset(conc="1,2,4", duration=15.0, warmup="2req", token_scale=0.02,
                        think_time_scale=0.01, think_time_cap=1.0),
    "small": BenchPreset(conc="1,2,4,8,16", duration=30.0, warmup="2req", token_scale=0.1,
                         think_time_scale=0.02, think_time_cap=2.0),
    "v32": BenchPreset(conc="1,2,4,8,16", duration=60.0, warmup="1req", token_scale=1.0,
                       think_time_scale=1.0, think_time_cap=None),
}
GPU_MODEL, CPU_MODEL = "small", "tiny"


PRESET_FIELDS = ("conc", "duration", "warmup", "token_scale", "think_time_scale", "think_time_cap")
TRACE_FIELDS = ("token_scale", "think_time_scale", "think_time_cap")  # what replay takes for our server
WINDOW_FIELDS = ("duration", "warmup")  # ... and what `loadgen capacity` takes too


def preset_flags(preset: BenchPreset, names: tuple[str, ...]) -> dict[str, float | str]:
    """The preset's values of `names` that it sets (a None field leaves the flag to its default)."""
    return {name: value for name in names if (value := getattr(preset, name)) is not None}


def flag_text(values: dict) -> str:
    """`--name value ...` as a user would type them."""
    return " ".join(f"--{name.replace('_', '-')} {value:g}" if isinstance(value, float)
                    else f"--{name.replace('_', '-')} {value}" for name, value in values.items())


def preset_for(model: str) -> BenchPreset:
    """The model's preset; models without one (larger ones, on a GPU) take the GPU model's."""
    return BENCH_PRESETS.get(model, BENCH_PRESETS[GPU_MODEL])
