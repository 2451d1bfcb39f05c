"""Server configuration: model presets, cache, scheduler, parallelism, speculative decoding, HTTP.

The frozen dataclasses of this package are the only home of every default of `server start` and
the engine. A field that is also a command-line flag carries its flag in `metadata=cli(...)`
(name, help, choices; flags.py); server/args.py builds argparse from those fields, so adding a
flag is adding one field. `server start`, `loadgen bench` and `python -m server.parallel` share
that one definition, and validation errors name the flag.

- model.py: the model's shapes and the presets `--model` picks;
- engine.py: `EngineConfig` (cache, scheduler, tensor parallelism) and its validation;
- speculative.py: `--speculative-config` and the golden-curve acceptance length;
- device.py: what 'auto' means for the device and the kernel backend;
- http.py: `server start`'s HTTP side.

The names below are the package's interface; import them from `server.config`.
"""

from server.config.device import resolve_backend, resolve_device
from server.config.engine import CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig, resolve_overlap
from server.config.flags import Flag
from server.config.http import API_KEY_ENV, HttpConfig
from server.config.model import ModelChoice, ModelConfig, model_preset
from server.config.speculative import SpeculativeConfig, SpeculativeFlags

__all__ = [
    "API_KEY_ENV", "CacheConfig", "EngineConfig", "Flag", "HttpConfig", "ModelChoice", "ModelConfig",
    "ParallelConfig", "SchedulerConfig", "SpeculativeConfig", "SpeculativeFlags", "model_preset",
    "resolve_backend", "resolve_device", "resolve_overlap",
]
