"""Token sampling on the device for a whole batch: greedy, temperature, top-p, per-request seeds.

Rows with temperature 0 take the argmax. Other rows scale by 1/temperature, keep the smallest
set of tokens whose probability reaches top_p, and sample by the exponential-race trick
(argmax of p / E with E ~ Exp(1)), drawing E from the request's own torch.Generator when it has
a seed, so a seeded request gets the same tokens whatever else is in the batch. Requests below
`min_tokens` outputs cannot draw EOS. The caller does one host copy of the returned tokens
(none when they are a decode graph's argmax, which the graph wrote to the host itself);
per-request values reach the device by asynchronous copies from pinned memory, so sampling never
makes the host wait for the device (which would undo overlapped scheduling).
"""

from __future__ import annotations

import torch

from kernels.argmax import argmax_rows
from server.engine.pending import to_device_async
from server.engine.sequence import Sequence


class Sampler:
    def __init__(self, device: torch.device, eos_token_id: int, seed: int, backend: str | None = None) -> None:
        self.device = device
        self.backend = backend  # the kernels' backend (kernels.backend): whose argmax runs
        self.eos_token_id = eos_token_id
        self.generator = torch.Generator(device=device)  # for unseeded requests
        self.generator.manual_seed(seed)
        self._seeded: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._seeded.pop(request_id, None)

    def seeded_generator(self, request_id: str, seed: int) -> torch.Generator:
        """The generator of a seeded request: made from its seed at its first draw, kept until `forget`."""
        g = self._seeded.get(request_id)
        if g is None:
            g = torch.Generator(device=self.device)
            g.manual_seed(seed)
            self._seeded[request_id] = g
        return g

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], offsets: list[int] | None = None,
                 argmax: torch.Tensor | None = None) -> torch.Tensor:
        """logits fp32 [S, V], one row per sequence -> token ids int64 [S] on the device.
        A sequence may own several rows (speculative verification); `offsets[i]` is how many of
        its tokens come before row i's in this step, for the min_tokens rule. argmax: the rows'
        argmax computed already (a decode graph's), taken for the greedy rows unless a row's EOS
        is suppressed (which changes the logits); an all-greedy batch returns it as it is."""
        if self.suppress_eos(logits, seqs, offsets):
            argmax = None
        greedy = self.greedy(logits) if argmax is None else argmax
        temps = [s.params.temperature for s in seqs]
        if all(t == 0.0 for t in temps):
            return greedy
        sampled = self.race(self.probs(logits, seqs), seqs)
        is_greedy = self.to_device([t == 0.0 for t in temps])
        return torch.where(is_greedy, greedy, sampled)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """The argmax of each row of fp32 logits [S, V]: int64 [S]."""
        return argmax_rows(logits, self.backend)

    def suppress_eos(self, logits: torch.Tensor, seqs: list[Sequence], offsets: list[int] | None = None) -> bool:
        """Requests still below `min_tokens` outputs cannot draw EOS (in place); True if any row changed."""
        offsets = offsets or [0] * len(seqs)
        suppress = [i for i, (s, o) in enumerate(zip(seqs, offsets)) if s.num_output_tokens + o < s.params.min_tokens]
        if suppress:
            logits[self.to_device(suppress), self.eos_token_id] = float("-inf")
        return bool(suppress)

    def probs(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Sampling distribution per row: softmax at the request's temperature, cut to its top_p
        (temperature-0 rows are treated as temperature 1; callers take their argmax instead)."""
        temps = [s.params.temperature for s in seqs]
        temp_t = self.to_device([t if t > 0 else 1.0 for t in temps])
        probs = torch.softmax(logits / temp_t[:, None], dim=-1)
        top_ps = [s.params.top_p for s in seqs]
        if any(p < 1.0 for p in top_ps):
            probs = _top_p(probs, self.to_device(top_ps))
        return probs

    def race(self, probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row drawn from `probs` (any non-negative weights) by the exponential race."""
        return self.greedy(probs / self.exponential(probs.shape, seqs))

    def exponential(self, shape: torch.Size, seqs: list[Sequence]) -> torch.Tensor:
        """Exp(1) noise [rows, ...], each row from its request's generator when it has a seed."""
        noise = torch.empty(shape, device=self.device)
        unseeded = [i for i, s in enumerate(seqs) if s.params.seed is None]
        if unseeded:
            drawn = torch.empty((len(unseeded),) + tuple(shape[1:]), device=self.device)
            noise[self.to_device(unseeded)] = drawn.exponential_(generator=self.generator)
        for i, s in enumerate(seqs):
            if s.params.seed is not None:
                noise[i].exponential_(generator=self.seeded_generator(s.request_id, s.params.seed))
        return noise

    def to_device(self, values: list) -> torch.Tensor:
        """A list of per-row values as a tensor on the device, without waiting for it."""
        return to_device_async(torch.tensor(values), self.device)


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every token outside the smallest top set whose mass reaches top_p (the best token stays)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = mass_before >= top_p[:, None]
    drop[:, 0] = False  # a top_p below float32's smallest number arrives as 0, which would drop them all
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
