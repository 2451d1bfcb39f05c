"""Speculative decoding: draft proposal, verification of k + 1 positions, acceptance statistics.

Each step a running request with drafts contributes 1 + k' query tokens (its last committed
token and k' <= k drafts) through the same runner and sparse-MLA kernels as any other token;
the target's logits at all 1 + k' positions come back from that one pass. Verification picks
how many drafts `a` are accepted; the request emits drafts 1..a and then the target's token at
position a (the correction, or the bonus when all drafts pass) in one output. The KV rows of
the k' - a rejected positions stay in the cache but are not counted as computed, so the next
step overwrites them and the context lengths keep every reader away from them; blocks that
only held them are freed (`Scheduler.commit`).

Verification:
- synthetic: `a` is drawn per request per step from the schedule's conditional rates
  (golden_al.AcceptanceSampler, seeded per request), independent of the drafts' content, so the
  cost is that of real verification while the acceptance length follows the golden curve. A
  request's `acceptance_length` (an extension field) replaces the engine's schedule with the
  min-variance schedule for that AL at the engine's k.
- standard: greedy requests accept while the draft equals the target's argmax; sampled requests
  use rejection sampling (accept draft x with probability min(1, p(x)/q(x)), on rejection draw
  from normalised max(p - q, 0)), which leaves the output distribution exactly the target's.

After the step the draft head proposes the next drafts from the target's hidden state at the
last emitted position (`propose`); near max_tokens or the context limit fewer are proposed so
no request ever emits past its end.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from golden_al import AcceptanceSampler, min_variance_rates
from server.config import SpeculativeConfig
from server.engine.messages import SamplingParams
from server.engine.sampler import Sampler
from server.engine.scheduler import ScheduledBatch
from server.engine.sequence import Sequence
from server.model.draft import build_draft_head
from server.model.runner import ModelRunner


@dataclass(frozen=True, slots=True)
class Verdict:
    """One request's result of a step: tokens to emit, rejected drafts, and the row (in the
    step's logits/hidden states) of the position whose token was emitted last (-1: none)."""

    emitted: list[int]
    num_rejected: int
    hidden_row: int


class SpeculativeDecoder:
    def __init__(self, config: SpeculativeConfig, runner: ModelRunner, sampler: Sampler, seed: int,
                 max_model_len: int) -> None:
        self.config = config
        self.k = config.num_speculative_tokens
        self.runner = runner
        self.sampler = sampler
        self.seed = seed
        self.max_model_len = max_model_len
        self.draft = build_draft_head(runner.config.model, runner.device, runner.dtype, seed)
        self.num_drafts = 0  # verify steps
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_position = [0] * self.k
        self._acceptance: dict[str, AcceptanceSampler] = {}
        self._draft_probs: dict[str, torch.Tensor] = {}  # standard mode, sampled requests: q of the drafts

    # ---- requests ------------------------------------------------------------------------
    def check(self, params: SamplingParams) -> None:
        """ValueError if the request's acceptance_length cannot be used at this k."""
        al = params.acceptance_length
        if al is None or not self.config.synthetic:
            return
        if not (math.isfinite(al) and 1 <= al <= self.k + 1):
            raise ValueError(f"acceptance_length must be in [1, {self.k + 1}] (num_speculative_tokens "
                             f"k={self.k}), got {al}")

    def forget(self, request_id: str) -> None:
        self._acceptance.pop(request_id, None)
        self._draft_probs.pop(request_id, None)

    def num_drafts_allowed(self, seq: Sequence) -> int:
        """Drafts to propose so that even a fully accepted step stays within max_tokens and the context."""
        left = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq))
        return max(0, min(self.k, left - 1))

    # ---- the verify step -----------------------------------------------------------------
    def execute(self, batch: ScheduledBatch) -> tuple[list[Verdict], torch.Tensor]:
        """Run the batch with each request's drafts appended and verify them. Returns a verdict
        per request and the hidden states of every position that has logits."""
        drafts = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            # A tight token budget may have scheduled fewer positions than there are drafts.
            verified = seq.draft_token_ids[:n - 1] if seq.draft_token_ids else []
            seq.draft_token_ids = []
            seq.token_ids.extend(verified)
            drafts.append(verified)
        num_logits = [len(d) + 1 if s.num_computed_tokens + n == len(s) else 0
                      for s, n, d in zip(batch.seqs, batch.num_new_tokens, drafts)]
        try:
            logits, hidden = self.runner.execute_with_hidden(batch, num_logits)
        finally:
            for seq, d in zip(batch.seqs, drafts):
                del seq.token_ids[len(seq) - len(d):]
        return self._verify(batch.seqs, drafts, num_logits, logits), hidden

    @torch.inference_mode()
    def _verify(self, seqs: tuple[Sequence, ...], drafts: list[list[int]], num_logits: list[int],
                logits: torch.Tensor) -> list[Verdict]:
        rows = [(s, j) for s, n in zip(seqs, num_logits) for j in range(n)]
        if not rows:
            return [Verdict([], 0, -1) for _ in seqs]
        # The target's token at every verified position, with min_tokens counted per position.
        targets = self.sampler(logits.clone(), [s for s, _ in rows], [j for _, j in rows])
        starts = [sum(num_logits[:i]) for i in range(len(seqs))]
        probabilistic = [i for i, (s, d) in enumerate(zip(seqs, drafts))
                         if d and not self.config.synthetic and s.params.temperature > 0]
        decided = [self._rejection_sample(seqs[i], drafts[i], logits[starts[i]:starts[i] + num_logits[i]])
                   for i in probabilistic]
        host = torch.cat([targets] + [torch.stack(d) for d in decided]).tolist()  # the step's host sync
        target_tokens, decided_host = host[:len(rows)], host[len(rows):]
        overrides = {i: (decided_host[2 * j], decided_host[2 * j + 1]) for j, i in enumerate(probabilistic)}
        verdicts = []
        for i, (seq, d, n) in enumerate(zip(seqs, drafts, num_logits)):
            if n == 0:
                verdicts.append(Verdict([], 0, -1))
                continue
            own = target_tokens[starts[i]:starts[i] + n]
            if i in overrides:
                accepted, token = overrides[i]
            else:
                accepted = self._accepted(seq, d, own)
                token = own[accepted]
            if d:
                self._record(seq, len(d), accepted)
            verdicts.append(Verdict(d[:accepted] + [token], len(d) - accepted, starts[i] + accepted))
        return verdicts

    def _accepted(self, seq: Sequence, drafts: list[int], targets: list[int]) -> int:
        if not drafts:
            return 0
        if self.config.synthetic:
            return min(self._acceptance_sampler(seq).sample(), len(drafts))
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        return accepted

    def _acceptance_sampler(self, seq: Sequence) -> AcceptanceSampler:
        sampler = self._acceptance.get(seq.request_id)
        if sampler is None:
            al = seq.params.acceptance_length
            rates = self.config.acceptance_rates if al is None else min_variance_rates(al, self.k)
            # Seeded per request, so a request's acceptance does not depend on what it is batched with.
            seed = (self.seed & 0xFFFFFFFF) << 32 | zlib.crc32(seq.request_id.encode())
            sampler = self._acceptance[seq.request_id] = AcceptanceSampler(rates, seed=seed)
        return sampler

    def _rejection_sample(self, seq: Sequence, drafts: list[int],
                          logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted count, emitted token) as device scalars, by standard rejection sampling."""
        k = len(drafts)
        row_seqs = [seq] * (k + 1)
        self.sampler.suppress_eos(logits, row_seqs, list(range(k + 1)))
        p = self.sampler.probs(logits, row_seqs)
        q = self._draft_probs[seq.request_id][:k]
        positions = torch.arange(k, device=p.device)
        tokens = torch.tensor(drafts, device=p.device)
        generator = self.sampler.generator if seq.params.seed is None else self.sampler._generator(seq)
        u = torch.rand(k, device=p.device, generator=generator)
        passes = u * q[positions, tokens] <= p[positions, tokens]
        accepted = torch.cumprod(passes.long(), 0).sum()
        residual = (p[:k] - q).clamp_(min=0)
        empty = residual.sum(-1, keepdim=True) == 0  # p <= q everywhere: fall back to p itself
        candidates = torch.cat((torch.where(empty, p[:k], residual), p[k:]))
        return accepted, self.sampler.race(candidates, row_seqs)[accepted]

    def _record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        for position in range(accepted):
            self.accepted_per_position[position] += 1
        seq.num_drafts += 1
        seq.num_draft_tokens += proposed
        seq.num_accepted_tokens += accepted

    # ---- the next drafts -----------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs: tuple[Sequence, ...], verdicts: list[Verdict], hidden: torch.Tensor) -> None:
        """Drafts for every request that emitted this step and goes on, from the target's hidden
        state at its last emitted position and that token."""
        chosen = [(s, v.hidden_row, self.num_drafts_allowed(s)) for s, v in zip(seqs, verdicts)
                  if v.emitted and not s.is_finished]
        chosen = [c for c in chosen if c[2] > 0]
        if not chosen:
            return
        draft_seqs = [s for s, _, _ in chosen]
        device = hidden.device
        rows = torch.tensor([r for _, r, _ in chosen], device=device)
        last = torch.tensor([s.token_ids[-1] for s in draft_seqs], device=device)
        sampled = [i for i, s in enumerate(draft_seqs) if not self.config.synthetic and s.params.temperature > 0]
        probs: list[torch.Tensor] = []

        def choose(logits: torch.Tensor, i: int) -> torch.Tensor:
            self.sampler.suppress_eos(logits, draft_seqs, [i] * len(draft_seqs))
            tokens = self.sampler.greedy(logits)
            if sampled:
                sampled_seqs = [draft_seqs[j] for j in sampled]
                q = self.sampler.probs(logits[sampled], sampled_seqs)
                tokens[sampled] = self.sampler.race(q, sampled_seqs)
                probs.append(q)
            return tokens

        k = max(n for _, _, n in chosen)
        drafts = self.draft.propose(hidden[rows], last, self.runner.model, k, choose,
                                    self.runner.settings.backend).tolist()
        for (seq, _, n), d in zip(chosen, drafts):
            seq.draft_token_ids = d[:n]
        if sampled:
            q_all = torch.stack(probs, dim=1)  # [sampled, k, V]
            for j, i in enumerate(sampled):
                self._draft_probs[draft_seqs[i].request_id] = q_all[j]
