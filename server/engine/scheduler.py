"""Continuous batching: which requests run in the next step, and with how many tokens each.

Each step has a token budget (`max_num_batched_tokens`). Running requests go first, decodes
before unfinished prefills, so generation never stalls behind a long prompt; then waiting
requests are admitted in arrival order while the budget, `max_num_seqs` and free KV blocks
allow. A prompt longer than the remaining budget is prefilled in chunks over several steps.
While requests wait, an unfinished prefill takes at most `long_prefill_chunk` tokens before the
admissions, and what they leave after. First come, first served would let one uncached prompt
of tens of thousands of tokens take every step's budget for dozens of steps while the requests
behind it, mostly served from the prefix cache and each a step's work, wait for all of it
(head-of-line blocking); this way the long prompt still advances every step, and takes all the
budget when no one waits. A new request's first chunk is not cut: one admitted in the same step
as a request sharing its prefix finds that prefix cached from the next step on.
When a running request needs a block and none is free, the newest running request is preempted
by recompute: its blocks are freed and it goes back to the head of the waiting queue with all
its tokens, to be prefilled again (often largely from the prefix cache); its pending drafts are
dropped. A request is always in exactly one of `waiting`, `running` or finished, so none is lost
or duplicated. A decode with drafts asks for 1 + len(drafts) tokens (the last committed token
and the drafts to verify); a tight budget may verify fewer of them, and a full cache drops
them before it preempts anyone.

A step is accounted either all at once when its tokens are back (`commit`, with speculative
decoding) or in two halves: `launch` when it goes to the device (its tokens count as computed,
placeholders stand for the tokens it samples) and `resolve` when the tokens are back. Between
the two the next step may be scheduled (overlapped scheduling, server/engine/pending.py); a
request that is certain to finish by length once its pending token lands is not scheduled again.
A speculative step with synthetic acceptance, whose accepted counts the host draws before the
device runs it, is accounted the same way (`launch_verify`, `resolve_verify`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from server.config import SchedulerConfig
from server.engine.kv_cache import BlockManager
from server.engine.sequence import Sequence, SequenceStatus, placeholder, placeholder_bank, placeholder_row


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """Requests of one step in batch order, with the number of new tokens each computes."""

    seqs: tuple[Sequence, ...]
    num_new_tokens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, eos_token_id: int,
                 max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.blocks = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order; the last is the newest
        self.num_preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up at first admission
        self.prefix_hits = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        chunk = self.config.long_prefill_chunk if self.waiting else budget
        seqs: list[Sequence] = []
        counts: list[int] = []
        preempted = False
        decodes_first = sorted(self.running, key=lambda s: s.num_uncomputed_tokens > 1)
        for seq in decodes_first:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or self._length_reached(seq, len(seq.token_ids)):
                continue  # preempted earlier in this loop, or finishing when its pending token lands
            limit = budget if seq.num_uncomputed_tokens <= 1 else min(budget, chunk)
            n = min(seq.num_uncomputed_tokens + len(seq.draft_token_ids), limit)
            while not self.blocks.try_append(seq, n):
                if seq.draft_token_ids:  # speculation must never cost another request its blocks
                    seq.draft_token_ids = []
                    n = min(seq.num_uncomputed_tokens, budget)
                    continue
                victim = next((s for s in reversed(self.running) if s is not seq and s not in seqs), seq)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                seqs.append(seq)
                counts.append(n)
                budget -= n
        # Admitting new work right after preempting would only thrash the cache.
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hits = self.blocks.prefix_hit(seq)
            n = min(len(seq) - len(hits) * self.blocks.block_size, budget)
            if not self.blocks.can_admit(seq, hits, n):
                break
            self.waiting.popleft()
            self.blocks.admit(seq, hits)
            self.blocks.append(seq, n)
            if not seq.admitted_once:
                seq.admitted_once = True
                seq.num_cached_tokens = seq.num_computed_tokens
                self.prefix_queries += seq.num_prompt_tokens
                self.prefix_hits += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        if budget and chunk < self.config.max_num_batched_tokens:
            self._extend_prefills(seqs, counts, budget)
        return ScheduledBatch(tuple(seqs), tuple(counts))

    def _extend_prefills(self, seqs: list[Sequence], counts: list[int], budget: int) -> None:
        """Give the budget the admissions left to the prefills cut short, shortest remainder first."""
        cut = sorted((seq.num_uncomputed_tokens - n, i) for i, (seq, n) in enumerate(zip(seqs, counts))
                     if n < seq.num_uncomputed_tokens and not seq.draft_token_ids)
        for remainder, i in cut:
            extra = min(remainder, budget)
            if self.blocks.try_append(seqs[i], counts[i] + extra):
                counts[i] += extra
                budget -= extra
            if not budget:
                return

    def postprocess(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[Sequence]:
        """Account a step without drafts: one sampled token per request that reached the end of
        its tokens (None for a prefill chunk). Returns the requests that finished."""
        self.commit(batch, [[] if t is None else [t] for t in sampled], [0] * len(batch.seqs))
        return [seq for seq in batch.seqs if seq.is_finished]

    def commit(self, batch: ScheduledBatch, emitted: list[list[int]], num_rejected: list[int]) -> list[list[int]]:
        """Account a finished step. Per request: the tokens it produced (accepted drafts, then the
        target's token) and how many of its scheduled tokens were rejected drafts, whose KV is
        not counted (their cache rows are overwritten later; nothing reads past the length) and
        whose now-unneeded blocks are freed. Tokens after a stop are dropped. Returns the tokens
        each request actually gained."""
        kept_all = []
        for seq, n, tokens, rejected in zip(batch.seqs, batch.num_new_tokens, emitted, num_rejected):
            seq.num_computed_tokens += n - rejected
            kept: list[int] = []
            reason = None
            for token in tokens:
                seq.token_ids.append(token)
                kept.append(token)
                reason = self._stop_reason(seq, token, len(seq))
                if reason is not None:
                    break
            # A stop inside accepted drafts leaves KV computed for tokens that were dropped.
            seq.num_computed_tokens = min(seq.num_computed_tokens, len(seq))
            self.blocks.commit_full_blocks(seq)
            if reason is not None:
                self.finish(seq, reason)
            elif rejected:
                self.blocks.release_tail(seq)
            kept_all.append(kept)
        return kept_all

    def launch(self, batch: ScheduledBatch, num_logits: list[int]) -> list[int]:
        """Account a step as it goes to the device: its scheduled tokens count as computed, and each
        request that samples gets a placeholder for its token (the i-th sampling request's is
        `placeholder(i)`). Returns each request's placeholder index in its token_ids (-1: none)."""
        at: list[int] = []
        row = 0
        for seq, n, k in zip(batch.seqs, batch.num_new_tokens, num_logits):
            seq.num_computed_tokens += n
            if k:
                at.append(len(seq))
                seq.token_ids.append(placeholder(row))
                row += 1
            else:
                at.append(-1)
            self.blocks.commit_full_blocks(seq)  # a request admitted next step can hit them already
        return at

    def resolve(self, batch: ScheduledBatch, placeholder_at: list[int], sampled: list[int]) -> list[list[int]]:
        """Account a launched step's tokens (in the order of the requests that sample): each
        replaces its placeholder. A request finished meanwhile (aborted, or stopped by the step
        before) gets nothing: the token it computed is dropped. A stop also drops the next step's
        placeholder and the KV counted for it. Returns the tokens each request gained."""
        tokens = iter(sampled)
        kept_all: list[list[int]] = []
        for seq, at in zip(batch.seqs, placeholder_at):
            token = next(tokens) if at >= 0 else None
            if seq.is_finished or token is None:
                if not seq.is_finished:
                    self.blocks.commit_full_blocks(seq)
                kept_all.append([])
                continue
            seq.token_ids[at] = token
            reason = self._stop_reason(seq, token, at + 1)
            if reason is not None:
                del seq.token_ids[at + 1:]
                seq.num_computed_tokens = min(seq.num_computed_tokens, at)
            self.blocks.commit_full_blocks(seq)
            if reason is not None:
                self.finish(seq, reason)
            kept_all.append([token])
        return kept_all

    def launch_verify(self, batch: ScheduledBatch, num_logits: list[int], drafts: list[list[int]],
                      accepted: list[int], bank: int) -> list[int]:
        """Account a speculative step as it goes to the device, its acceptance decided on the host:
        per request, its scheduled tokens less the rejected drafts count as computed, the accepted
        drafts (`drafts`, values or the step before's placeholders) and a placeholder for the
        target's token join token_ids (the i-th verifying request's is row i of the step's `bank`),
        and blocks that only held rejected positions are freed. Returns the index of each request's
        first new token in its token_ids (-1: it samples nothing)."""
        at: list[int] = []
        row = 0
        for seq, n, k, d, a in zip(batch.seqs, batch.num_new_tokens, num_logits, drafts, accepted):
            seq.num_computed_tokens += n - (len(d) - a)
            if k:
                at.append(len(seq))
                seq.token_ids.extend(d[:a])
                seq.token_ids.append(placeholder(row, bank))
                row += 1
                if a < len(d):
                    self.blocks.release_tail(seq)
            else:
                at.append(-1)
            self.blocks.commit_full_blocks(seq)
        return at

    def resolve_verify(self, batch: ScheduledBatch, first_at: list[int], accepted: list[int], bank: int,
                       sampled: list[int]) -> list[list[int]]:
        """Account a launched speculative step's tokens: each placeholder of its `bank`, wherever it
        went since (the request's emitted token, the next step's accepted drafts, drafts still to
        verify), takes its value; then the emitted tokens are checked for a stop as `commit` does.
        A request finished meanwhile gets nothing. Returns the tokens each request gained."""
        kept_all: list[list[int]] = []
        for seq, at, a in zip(batch.seqs, first_at, accepted):
            if seq.is_finished or at < 0:
                if not seq.is_finished:
                    self.blocks.commit_full_blocks(seq)
                kept_all.append([])
                continue
            _fill_bank(seq.token_ids, at, bank, sampled)
            _fill_bank(seq.draft_token_ids, 0, bank, sampled)
            kept: list[int] = []
            reason = None
            for i in range(at, at + a + 1):
                kept.append(seq.token_ids[i])
                reason = self._stop_reason(seq, seq.token_ids[i], i + 1)
                if reason is not None:
                    break
            if reason is not None:
                del seq.token_ids[at + len(kept):]
                seq.num_computed_tokens = min(seq.num_computed_tokens, len(seq))
                self.finish(seq, reason)
            else:
                self.blocks.commit_full_blocks(seq)
            kept_all.append(kept)
        return kept_all

    def _stop_reason(self, seq: Sequence, token: int, length: int) -> str | None:
        """Why seq stops at `token`, its length-th token (None: it goes on)."""
        p = seq.params
        num_output = length - seq.num_prompt_tokens
        if token == self.eos_token_id and not p.ignore_eos and num_output > p.min_tokens:
            return "stop"
        return "length" if self._length_reached(seq, length) else None

    def _length_reached(self, seq: Sequence, length: int) -> bool:
        """A sequence of `length` tokens has all the output tokens or context it may hold."""
        return length - seq.num_prompt_tokens >= seq.params.max_tokens or length >= self.max_model_len

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.draft_token_ids = []
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark seq finished with `reason` and release its blocks, wherever it is."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason


def _fill_bank(tokens: list[int], start: int, bank: int, sampled: list[int]) -> None:
    """Replace the placeholders of `bank` in tokens[start:] by their rows of `sampled`."""
    for i in range(start, len(tokens)):
        t = tokens[i]
        if t < 0 and placeholder_bank(t) == bank:
            tokens[i] = sampled[placeholder_row(t)]
