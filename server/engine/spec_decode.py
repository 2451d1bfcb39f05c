"""Speculative decoding: draft proposal, verification of k + 1 positions, acceptance statistics.

Each step a running request with drafts contributes 1 + k' query tokens (its last committed
token and k' <= k drafts) through the same runner and sparse-MLA kernels as any other token;
the target's logits at all 1 + k' positions come back from that one pass. Verification picks
how many drafts `a` are accepted; the request emits drafts 1..a and then the target's token at
position a (the correction, or the bonus when all drafts pass) in one output. The KV rows of
the k' - a rejected positions stay in the cache but are not counted as computed, so the next
step overwrites them and the context lengths keep every reader away from them; blocks that
only held them are freed (`Scheduler.commit`, or `Scheduler.launch_verify` when overlapped).

Verification:
- synthetic: `a` is drawn per request per step from the schedule's conditional rates
  (golden_al.AcceptanceSampler, seeded per request), independent of the drafts' content, so the
  cost is that of real verification while the acceptance length follows the golden curve. A
  request's `acceptance_length` (an extension field) replaces the engine's schedule with the
  min-variance schedule for that AL at the engine's k.
- standard: greedy requests accept while the draft equals the target's argmax; sampled requests
  use rejection sampling (accept draft x with probability min(1, p(x)/q(x)), on rejection draw
  from normalised max(p - q, 0)), which leaves the output distribution exactly the target's.

Right after verification, still on the device, the draft head proposes the next drafts from the
target's hidden state at the last emitted position: the accepted counts and emitted tokens never
visit the host in between, so a step waits for the device once (for its verdicts and drafts
together) and the host queues the proposal's launches while the target's pass runs. Near
max_tokens or the context limit fewer drafts are handed out (`propose`), so no request ever emits
past its end.

With synthetic acceptance the host knows each request's accepted count before the device runs
the step, so the step can be accounted as it is launched and the next one scheduled while the
device computes (overlapped scheduling, `launch` and `resolve`): the emitted tokens and the next
drafts are placeholders (server/engine/pending.py) into the step's one output tensor until they
are read, one step later. Standard verification decides on the device and runs a step at a time.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import torch

from golden_al import min_variance_rates
from golden_al.sampler import AcceptanceSampler
from server.config import SpeculativeConfig
from server.engine.messages import SamplingParams
from server.engine.model_runner import ModelRunner
from server.engine.pending import LaunchedStep, TokenCopies, VerifyPlan
from server.engine.sampler import Sampler
from server.engine.scheduler import ScheduledBatch, Scheduler
from server.engine.sequence import Sequence, placeholder
from server.model.draft import build_draft_head


class Decided(NamedTuple):
    """A verify step's decisions, on the device and not waited for: the verifying requests' batch
    positions, their accepted drafts and emitted tokens (int64), the next drafts (int64 [verifying,
    width], None when no request may have any) and the accepted counts the host knows (synthetic)."""

    verifying: list[int]
    accepted: torch.Tensor
    tokens: torch.Tensor
    proposal: torch.Tensor | None
    counts: list[int]

    @property
    def width(self) -> int:
        """Drafts proposed per verifying request."""
        return 0 if self.proposal is None else self.proposal.shape[1]

    def flat_proposal(self) -> tuple[torch.Tensor, ...]:
        """The next drafts as one flat tensor, request by request, or nothing: for a concatenation."""
        return () if self.proposal is None else (self.proposal.flatten(),)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One request's result of a step: tokens to emit and rejected drafts."""

    emitted: list[int]
    num_rejected: int


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
        self._proposed: dict[str, list[int]] = {}  # the step's drafts per request, until `propose`
        self._bank = 0  # the placeholder bank of the next launched step (overlapped scheduling)

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

    # ---- the verify step -----------------------------------------------------------------
    def execute(self, batch: ScheduledBatch) -> list[Verdict]:
        """Run the batch with each request's drafts appended, verify them and launch the next
        drafts' proposal, then wait for the device once. Returns a verdict per request; `propose`
        hands the drafts out after the scheduler has committed the verdicts."""
        return self._verify(batch.seqs, *self._run_target(batch))

    def launch(self, batch: ScheduledBatch, scheduler: Scheduler, pending: torch.Tensor | None,
               copies: TokenCopies | None) -> LaunchedStep:
        """Overlapped scheduling (synthetic acceptance): run and verify the batch and launch the next
        drafts as `execute` does, without waiting for the device. The scheduler accounts the step
        at once from the accepted counts drawn on the host; each verifying request's emitted token
        and next drafts are placeholders into the step's output ([tokens; drafts]) until `resolve`.
        pending: the output of the step in flight, which the batch's placeholders stand for."""
        bank, self._bank = self._bank, self._bank ^ 1
        drafts, num_logits, logits, hidden = self._run_target(batch, pending)
        accepted = [0] * len(batch.seqs)
        verifying: list[int] = []
        output, width = None, 0
        decided = self._on_device(batch.seqs, drafts, num_logits, logits, hidden)
        if decided is not None:
            verifying, width = decided.verifying, decided.width
            for i, a in zip(verifying, decided.counts):
                accepted[i] = a
            output = torch.cat((decided.tokens, *decided.flat_proposal()))
        at = scheduler.launch_verify(batch, num_logits, drafts, accepted, bank)
        for j, i in enumerate(verifying):
            seq = batch.seqs[i]
            first = len(verifying) + j * width
            seq.draft_token_ids = [placeholder(first + p, bank) for p in range(min(width, self._drafts_allowed(seq)))]
        return LaunchedStep(batch, at, output, copies, verify=VerifyPlan([len(d) for d in drafts], accepted, bank))

    def resolve(self, launched: LaunchedStep, scheduler: Scheduler) -> list[list[int]]:
        """Read a launched step's output (its one wait for the device) and account it: the tokens
        each request gained. A request finished since the launch takes no part."""
        plan = launched.verify
        assert plan is not None
        for seq, proposed, a in zip(launched.batch.seqs, plan.num_drafts, plan.accepted):
            if proposed and not seq.is_finished:
                self._record(seq, proposed, a)
        return scheduler.resolve_verify(launched.batch, launched.placeholder_at, plan.accepted, plan.bank,
                                        launched.tokens())

    def _run_target(self, batch: ScheduledBatch, pending: torch.Tensor | None = None
                    ) -> tuple[list[list[int]], list[int], torch.Tensor, torch.Tensor]:
        """The target's pass over the batch with each request's drafts appended: (the drafts
        verified per request, logits rows per request, logits, hidden states)."""
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
            logits, hidden = self.runner.execute_with_hidden(batch, num_logits, pending)
        finally:
            for seq, d in zip(batch.seqs, drafts):
                del seq.token_ids[len(seq) - len(d):]
        return drafts, num_logits, logits, hidden

    @torch.inference_mode()
    def _on_device(self, seqs: tuple[Sequence, ...], drafts: list[list[int]], num_logits: list[int],
                   logits: torch.Tensor, hidden: torch.Tensor) -> Decided | None:
        """Each verifying request's accepted drafts and emitted token on the device and the next
        drafts launched from them (`_launch_proposal`), none of it waited for; None when no
        request verifies."""
        verifying = [i for i, n in enumerate(num_logits) if n]
        if not verifying:
            return None
        starts = [sum(num_logits[:i]) for i in range(len(seqs))]
        row_seqs = [seqs[i] for i in verifying for _ in range(num_logits[i])]
        offsets = [j for i in verifying for j in range(num_logits[i])]
        # The target's token at every verified position, with min_tokens counted per position.
        targets = self.sampler(logits.clone(), row_seqs, offsets)
        first_rows = self.sampler.to_device([starts[i] for i in verifying])
        accepted, tokens, counts = self._decide(seqs, drafts, starts, verifying, first_rows, logits, targets)
        proposal = self._launch_proposal([seqs[i] for i in verifying], accepted, tokens, hidden[first_rows + accepted])
        return Decided(verifying, accepted, tokens, proposal, counts)

    def _verify(self, seqs: tuple[Sequence, ...], drafts: list[list[int]], num_logits: list[int],
                logits: torch.Tensor, hidden: torch.Tensor) -> list[Verdict]:
        """The step's verdicts and next drafts in one host copy: the device runs the proposal's
        launches back to back while the host waits once, not twice."""
        self._proposed = {}
        decided = self._on_device(seqs, drafts, num_logits, logits, hidden)
        if decided is None:
            return [Verdict([], 0) for _ in seqs]
        verifying, width = decided.verifying, decided.width
        n = len(verifying)
        host = torch.cat((decided.accepted, decided.tokens, *decided.flat_proposal())).tolist()  # the one host sync
        accepted_host, tokens_host = host[:n], host[n:2 * n]
        verdicts = [Verdict([], 0) for _ in seqs]
        for j, i in enumerate(verifying):
            a, d = accepted_host[j], drafts[i]
            if d:
                self._record(seqs[i], len(d), a)
            verdicts[i] = Verdict(d[:a] + [tokens_host[j]], len(d) - a)
            if width:
                self._proposed[seqs[i].request_id] = host[2 * n + j * width:2 * n + (j + 1) * width]
        return verdicts

    def _decide(self, seqs: tuple[Sequence, ...], drafts: list[list[int]], starts: list[int], verifying: list[int],
                first_rows: torch.Tensor, logits: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(accepted drafts, emitted token) of each verifying request (its logits' first row in
        first_rows), int64 on the device, and the counts the host knows (synthetic; 0 where the
        device decides): synthetic counts drawn on the host, greedy ones by comparing the drafts
        with the targets on the device, sampled ones by rejection sampling; the token is the
        target's at the first position not accepted, or the rejection sampler's."""
        count = [0] * len(verifying)
        greedy: list[int] = []  # positions in `verifying` whose count the device finds
        for j, i in enumerate(verifying):
            if not drafts[i]:
                continue
            if self.config.synthetic:
                count[j] = min(self._acceptance_sampler(seqs[i]).sample(), len(drafts[i]))
            elif seqs[i].params.temperature == 0:
                greedy.append(j)
        accepted = self.sampler.to_device(count)
        if greedy:
            accepted[self.sampler.to_device(greedy)] = self._greedy_accepted(
                [drafts[verifying[j]] for j in greedy], [starts[verifying[j]] for j in greedy], targets)
        tokens = targets[first_rows + accepted]
        sampled = [j for j, i in enumerate(verifying)
                   if drafts[i] and not self.config.synthetic and seqs[i].params.temperature > 0]
        if sampled:
            decided = torch.stack([torch.stack(self._rejection_sample(
                seqs[verifying[j]], drafts[verifying[j]],
                logits[starts[verifying[j]]:starts[verifying[j]] + len(drafts[verifying[j]]) + 1]))
                for j in sampled])
            where = self.sampler.to_device(sampled)
            accepted[where], tokens[where] = decided[:, 0], decided[:, 1]
        return accepted, tokens, count

    def _greedy_accepted(self, drafts: list[list[int]], starts: list[int], targets: torch.Tensor) -> torch.Tensor:
        """How many leading drafts equal the targets at their positions, per request (device)."""
        width = max(map(len, drafts))
        padded = self.sampler.to_device([d + [-1] * (width - len(d)) for d in drafts])  # -1 matches no token
        positions = self.sampler.to_device(starts)[:, None] + torch.arange(width, device=targets.device)
        matches = targets[positions.clamp_(max=targets.shape[0] - 1)] == padded
        return torch.cumprod(matches.long(), dim=1).sum(dim=1)

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
        seed = seq.params.seed
        generator = self.sampler.generator if seed is None else self.sampler.seeded_generator(seq.request_id, seed)
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
    def _launch_proposal(self, seqs: list[Sequence], accepted: torch.Tensor, tokens: torch.Tensor,
                         hidden: torch.Tensor) -> torch.Tensor | None:
        """Launch the draft head's passes for every verifying request that may still get drafts
        (int64 [requests, passes] on the device, not waited for), from the target's hidden state at
        its last emitted position and that token; None when no request may. The host does not know
        yet how many tokens each request keeps, so it proposes as many drafts as one emitted token
        would allow (`propose`, or `launch` when overlapped, cuts them to what the request then
        allows) and EOS is kept out of draft i by the device's count: below min_tokens when outputs
        + accepted + 1 + i are."""
        limits = [self._drafts_allowed(s, emitted=1) for s in seqs]
        passes = max(limits)
        if passes == 0:
            return None
        outputs_left = [s.params.min_tokens - s.num_output_tokens - 1 for s in seqs]
        below_min = self.sampler.to_device(outputs_left) if max(outputs_left) > 0 else None
        sampled = [i for i, s in enumerate(seqs) if not self.config.synthetic and s.params.temperature > 0]
        probs: list[torch.Tensor] = []

        def choose(logits: torch.Tensor, i: int) -> torch.Tensor:
            if below_min is not None:
                logits[:, self.sampler.eos_token_id].masked_fill_(accepted < below_min - i, float("-inf"))
            drafted = self.sampler.greedy(logits)
            if sampled:
                sampled_seqs = [seqs[j] for j in sampled]
                q = self.sampler.probs(logits[sampled], sampled_seqs)
                drafted[sampled] = self.sampler.race(q, sampled_seqs)
                probs.append(q)
            return drafted

        proposal = self.draft.propose(hidden, tokens, self.runner.model, passes, choose, self.runner.settings.backend)
        if sampled:
            q_all = torch.stack(probs, dim=1)  # [sampled, passes, V]
            for j, i in enumerate(sampled):
                self._draft_probs[seqs[i].request_id] = q_all[j]
        return proposal

    def propose(self, seqs: tuple[Sequence, ...], verdicts: list[Verdict]) -> None:
        """After the scheduler committed the step's verdicts: each request that emitted and goes on
        takes the drafts `execute` proposed for it, as many as it may now have."""
        for seq, verdict in zip(seqs, verdicts):
            proposed = self._proposed.get(seq.request_id)
            if verdict.emitted and not seq.is_finished and proposed:
                seq.draft_token_ids = proposed[:self._drafts_allowed(seq)]
        self._proposed = {}

    def _drafts_allowed(self, seq: Sequence, emitted: int = 0) -> int:
        """Drafts a request may have after `emitted` more tokens, so that even a fully accepted step
        stays within max_tokens and the context."""
        left = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq)) - emitted
        return max(0, min(self.k, left - 1))
