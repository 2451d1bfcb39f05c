"""--speculative-config / --golden-al / --thinking: parsed into SpeculativeConfig through the real
engine flags, and every invalid combination refused with a message naming the flag or key."""

from __future__ import annotations

import argparse
import json

import pytest

from golden_al import load_curve
from server.args import add_engine_args, engine_config_from_args
from server.config import SpeculativeConfig
from server.engine.core import Engine
from server.engine.messages import AddRequest, SamplingParams


def config_from(*flags: str):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(["--device", "cpu", "--kv-cache-gb", "0.01", *flags]))


def spec(obj: dict, *flags: str) -> SpeculativeConfig | None:
    return config_from("--speculative-config", json.dumps(obj), *flags).speculative


MTP5 = {"method": "mtp", "num_speculative_tokens": 5}


def test_off_by_default():
    assert config_from().speculative is None


def test_synthetic_length_gives_min_variance_schedule():
    s = spec({**MTP5, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 3.51})
    assert s.synthetic and s.acceptance_rates == (1.0, 1.0, 0.51, 0.0, 0.0)


def test_synthetic_rates_and_implied_method():
    s = spec({"method": "dspark", "num_speculative_tokens": 3, "synthetic_acceptance_rates": [0.9, 0.5, 0.5]})
    assert s.rejection_sample_method == "synthetic" and s.acceptance_rates == (0.9, 0.5, 0.5)


def test_standard_is_the_default_method():
    s = spec(MTP5)
    assert s.rejection_sample_method == "standard" and s.acceptance_rates == ()


@pytest.mark.parametrize(("curve", "thinking", "k"), [("dsv4_mtp", "off", 3), ("dsv41flash_dspark", None, 5)])
def test_golden_al_picks_the_curve_value(curve, thinking, k):
    flags = ("--golden-al", curve) + (("--thinking", thinking) if thinking else ())
    s = spec({"method": "dspark", "num_speculative_tokens": k}, *flags)
    assert s.synthetic_acceptance_length == load_curve(curve).al(k, thinking != "off")


@pytest.mark.parametrize(("obj", "flags", "message"), [
    ({**MTP5, "synthetic_acceptance_length": 6.5}, (), r"synthetic_acceptance_length: .*outside \[1, 6\]"),
    ({**MTP5, "synthetic_acceptance_length": 0.5}, (), r"synthetic_acceptance_length: .*outside \[1, 6\]"),
    ({**MTP5, "synthetic_acceptance_rates": [0.5, 0.9, 0, 0, 0]}, (), r"synthetic_acceptance_rates: .*non-increasing"),
    ({**MTP5, "synthetic_acceptance_rates": [1.5, 0.9, 0, 0, 0]}, (),
     r"synthetic_acceptance_rates: .*outside \[0, 1\]"),
    ({**MTP5, "synthetic_acceptance_rates": [0.9, 0.5]}, (), r"synthetic_acceptance_rates: .*expected 5 values"),
    ({**MTP5, "synthetic_acceptance_length": 3, "synthetic_acceptance_rates": [1, 1, 0, 0, 0]}, (), "not both"),
    ({**MTP5, "rejection_sample_method": "synthetic"}, (), "needs synthetic_acceptance_length or"),
    ({**MTP5, "rejection_sample_method": "standard", "synthetic_acceptance_length": 3}, (),
     "need rejection_sample_method"),
    ({**MTP5, "rejection_sample_method": "magic"}, (), "rejection_sample_method must be one of"),
    ({"method": "eagle9", "num_speculative_tokens": 2}, (), "method must be one of mtp, dspark"),
    ({"method": "mtp", "num_speculative_tokens": 0}, (), "num_speculative_tokens must be an integer >= 1"),
    ({"method": "mtp"}, (), "missing 'num_speculative_tokens'"),
    ({**MTP5, "bogus": 1}, (), r"unknown key\(s\) \['bogus'\]"),
    ({"method": "mtp", "num_speculative_tokens": 3}, ("--golden-al", "dsv41flash_dspark"),
     r"--golden-al: .*has no thinking_on AL at k=3"),
    ({**MTP5}, ("--golden-al", "dsv41flash_dspark", "--thinking", "off"),
     r"--golden-al: .*has no thinking_off AL at k=5"),
    ({**MTP5}, ("--golden-al", "no_such_curve"), "--golden-al: unknown curve 'no_such_curve'"),
    ({**MTP5, "synthetic_acceptance_length": 3}, ("--golden-al", "dsv4_mtp"), "--golden-al: the curve gives"),
    ({**MTP5, "rejection_sample_method": "standard"}, ("--golden-al", "dsv4_mtp"),
     "--golden-al: needs rejection_sample_method"),
    ({**MTP5}, ("--thinking", "on"), "--thinking: only meaningful with --golden-al"),
])
def test_invalid_configs_are_refused(obj, flags, message):
    with pytest.raises(ValueError, match=message):
        spec(obj, *flags)


def test_malformed_json_and_golden_without_config():
    with pytest.raises(ValueError, match="--speculative-config: not valid JSON"):
        config_from("--speculative-config", "{method: mtp}")
    with pytest.raises(ValueError, match="--golden-al: needs --speculative-config"):
        config_from("--golden-al", "dsv4_mtp")


def test_request_acceptance_length_is_checked_at_add_request():
    engine = Engine(config_from("--speculative-config", json.dumps({**MTP5, "synthetic_acceptance_length": 3.51}),
                                "--num-layers", "1"))
    for bad in (0.5, 6.01, float("nan")):
        with pytest.raises(ValueError, match=r"acceptance_length must be in \[1, 6\]"):
            engine.add_request(AddRequest("r", (1, 2, 3), SamplingParams(max_tokens=4, acceptance_length=bad), 0.0))
    assert not engine.has_unfinished()
    engine.add_request(AddRequest("r", (1, 2, 3), SamplingParams(max_tokens=4, acceptance_length=6.0), 0.0))
    assert engine.has_unfinished()
