"""Sampling: greedy, temperature, top-p, per-request seeds, and the exact stop rules
(max_tokens, min_tokens, ignore_eos) on the tiny model."""

from __future__ import annotations

import torch

from server.engine.core import Engine
from server.engine.messages import SamplingParams
from server.engine.sampler import Sampler
from server.engine.sequence import Sequence
from tests.server.engine_fixtures import greedy, prompt, run, tiny_config, tokens

EOS = 257


def sampled(temperature=1.0, top_p=1.0, seed=None, max_tokens=12, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, ignore_eos=True, **kw)


def test_seeded_request_same_output_alone_or_batched():
    alone = tokens(run(Engine(tiny_config()), {"s": (prompt(1, 30), sampled(seed=123))}))["s"]
    others = {f"o{i}": (prompt(10 + i, 20 + i), sampled()) for i in range(3)}
    batched = tokens(run(Engine(tiny_config()), {**others, "s": (prompt(1, 30), sampled(seed=123))}))["s"]
    assert batched == alone
    different = tokens(run(Engine(tiny_config()), {"s": (prompt(1, 30), sampled(seed=124))}))["s"]
    assert different != alone


def test_limits_of_temperature_and_top_p_are_greedy():
    ref = tokens(run(Engine(tiny_config()), {"g": (prompt(2, 25), greedy(12))}))["g"]
    engine = Engine(tiny_config())
    out = tokens(run(engine, {
        "cold": (prompt(2, 25), sampled(temperature=1e-4, seed=1)),
        "narrow": (prompt(2, 25), sampled(top_p=1e-6, seed=2)),
        "free": (prompt(2, 25), sampled(temperature=1.0, seed=3)),
    }))
    assert out["cold"] == ref and out["narrow"] == ref
    assert out["free"] != ref  # a random 1024-token model at temperature 1 is nowhere near greedy


def seqs(n: int, **params) -> list[Sequence]:
    return [Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=10, **params), 0.0) for i in range(n)]


def test_top_p_keeps_the_smallest_set_reaching_p():
    sampler = Sampler(torch.device("cpu"), EOS, seed=0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05] + [0.0] * 4)
    logits = probs.log().expand(400, -1).clone()
    drawn = sampler(logits, seqs(400, temperature=1.0, top_p=0.7))
    assert set(drawn.tolist()) == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
    share = (drawn == 0).float().mean().item()
    assert 0.5 < share < 0.75  # renormalised 0.5/0.8 = 0.625
    full = sampler(logits.clone(), seqs(400, temperature=1.0, top_p=1.0))
    assert set(full.tolist()) == {0, 1, 2, 3}


def test_temperature_flattens_or_sharpens():
    sampler = Sampler(torch.device("cpu"), EOS, seed=0)
    logits = torch.linspace(0, 4, 16).expand(500, -1).clone()
    hot = sampler(logits.clone(), seqs(500, temperature=5.0))
    cold = sampler(logits.clone(), seqs(500, temperature=0.2))
    assert len(set(hot.tolist())) > 12
    expected = torch.softmax(logits[0] / 0.2, -1)[15].item()  # about 0.73
    assert abs((cold == 15).float().mean().item() - expected) < 0.06


def test_min_tokens_masks_eos_in_sampler():
    sampler = Sampler(torch.device("cpu"), EOS, seed=0)
    logits = torch.zeros(2, 300)
    logits[:, EOS] = 10.0
    s = seqs(2, temperature=0.0, min_tokens=1)
    s[1].token_ids.append(5)  # has one output token already: EOS allowed again
    assert sampler(logits, s).tolist()[1] == EOS
    assert sampler(logits.clone(), s).tolist()[0] != EOS


def eos_model(engine: Engine) -> None:
    """Make the model's greedy choice EOS at every position, through its real weights: the last
    MLP adds sum(a^2 sigmoid(a)) >= 0 to hidden dim 0 (up = gate), the head reads only dim 0."""
    model = engine.runner.model
    mlp = model.layers[-1].mlp
    with torch.no_grad():
        mlp.w_up.weight.copy_(mlp.w_gate.weight)
        mlp.w_down.weight.zero_()
        mlp.w_down.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[EOS, 0] = 1.0


def test_stop_rules_exact():
    engine = Engine(tiny_config())
    eos_model(engine)
    base = dict(max_tokens=6, temperature=0.0)
    out = run(engine, {
        "stop": (prompt(1, 10), SamplingParams(**base)),
        "min": (prompt(2, 10), SamplingParams(**base, min_tokens=3)),
        "ignore": (prompt(3, 10), SamplingParams(**base, ignore_eos=True)),
        "min_max": (prompt(4, 10), SamplingParams(**base, min_tokens=6)),
    })
    assert out["stop"]["tokens"] == [EOS] and out["stop"]["finish_reason"] == "stop"
    assert len(out["min"]["tokens"]) == 4 and out["min"]["tokens"][-1] == EOS and EOS not in out["min"]["tokens"][:3]
    assert out["min"]["finish_reason"] == "stop"
    assert out["ignore"]["tokens"] == [EOS] * 6 and out["ignore"]["finish_reason"] == "length"
    assert len(out["min_max"]["tokens"]) == 6 and EOS not in out["min_max"]["tokens"]
    assert out["min_max"]["finish_reason"] == "length"


def test_max_tokens_exact():
    out = run(Engine(tiny_config()), {f"m{n}": (prompt(n, 9), greedy(n)) for n in (1, 2, 7)})
    assert {rid: len(r["tokens"]) for rid, r in out.items()} == {"m1": 1, "m2": 2, "m7": 7}
    assert all(r["finish_reason"] == "length" for r in out.values())


def test_a_precomputed_argmax_serves_greedy_rows_unless_eos_is_suppressed():
    """A decode graph hands the sampler its logits' argmax: an all-greedy batch returns that very
    tensor (the next graph reads it in place), greedy rows of a mixed batch take it, and a row
    whose EOS is suppressed (the logits change) makes the sampler take its own argmax again."""
    sampler = Sampler(torch.device("cpu"), EOS, seed=0)
    logits = torch.zeros(3, 300)
    logits[:, 7] = 5.0
    logits[:, EOS] = 10.0
    planted = torch.tensor([11, 12, 13])  # not the logits' argmax: shows where each token came from
    assert sampler(logits.clone(), seqs(3, temperature=0.0), argmax=planted) is planted
    mixed = seqs(3, temperature=0.0)
    mixed[1] = seqs(1, temperature=1e-4, seed=4)[0]
    assert sampler(logits.clone(), mixed, argmax=planted).tolist() == [11, EOS, 13]
    held = seqs(3, temperature=0.0, min_tokens=1)
    assert sampler(logits.clone(), held, argmax=planted).tolist() == [7, 7, 7]
