"""The engine core: accepts requests, runs one scheduler iteration per `step`, reports outputs.

Pure synchronous code with no threads; the API process (or the in-process benchmark transport)
owns the loop around it. One step = schedule, build the batch, launch the model and the sampler
on the device, then a single host copy of the sampled tokens (none for a decode graph's greedy
tokens, which the graph writes to the host itself). With overlapped scheduling (the default;
server/engine/pending.py) a step launches the next batch before it reads the previous batch's
tokens, so the host's scheduling and input building run while the device computes, and each
request's tokens are reported one step later. It falls back to one batch at a time under
tensor parallelism (the other ranks embed the token ids themselves, and each step already waits
for every rank's device) and with standard speculative verification (the accepted counts are
decided on the device, and scheduling the next step needs them). With speculative decoding
(`server/engine/spec_decode.py`) the step verifies each request's drafts in the same pass, may emit
several tokens per request, and ends with the draft head proposing the next drafts; with
synthetic acceptance those steps overlap too.
"""

from __future__ import annotations

import sys
import time

from server.config import EngineConfig, resolve_overlap
from server.engine.kv_cache import BlockManager
from server.engine.messages import AddRequest, EngineStats, RequestOutput, SamplingParams, StepOutputs
from server.engine.model_runner import ModelRunner
from server.engine.pending import LaunchedStep, TokenCopies
from server.engine.sampler import Sampler
from server.engine.scheduler import ScheduledBatch, Scheduler
from server.engine.sequence import Sequence
from server.engine.spec_decode import SpeculativeDecoder
from server.engine.warmup import DECODE_TOKENS, log_compile_while_serving, prompt_ids, warmup_waves, watch_compiles


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model = config.model
        self.model_name = model.name
        self.vocab_size = model.vocab_size
        self.eos_token_id = model.eos_token_id
        self.max_model_len = config.max_model_len
        watch_compiles(None)  # an earlier engine's watch in this process: this one's start-up is no stall
        self.runner = ModelRunner(config)
        self.num_gpus = self.runner.num_gpus
        self.overlap = resolve_overlap(config)
        self._token_copies = (TokenCopies(self.runner.device, config.max_step_outputs)
                              if self.runner.device.type == "cuda" else None)
        self.compiles_while_serving = 0
        self._reset()
        self.warmup_seconds = 0.0
        if self.runner.compiles_kernels:
            self.warm_up()
            watch_compiles(self._compiled_while_serving)

    def _reset(self) -> None:
        """No request, an empty cache (no prefix cached), counters at zero, the samplers' seeds."""
        c = self.config
        self.blocks = BlockManager(self.runner.num_blocks, c.block_size, c.cache.enable_prefix_caching)
        self.scheduler = Scheduler(c.scheduler, self.blocks, self.eos_token_id, self.max_model_len)
        self.sampler = Sampler(self.runner.device, self.eos_token_id, c.seed, self.runner.settings.backend)
        self.spec = None if c.speculative is None else SpeculativeDecoder(
            c.speculative, self.runner, self.sampler, c.seed, self.max_model_len)
        self._in_flight: LaunchedStep | None = None  # overlapped scheduling: launched, tokens not yet read
        self.seqs: dict[str, Sequence] = {}
        self._aborted: list[RequestOutput] = []
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._step_time = 0.0

    def warm_up(self) -> None:
        """Run the requests of `warmup_waves` one at a time, each alone in its batch (greedy and
        sampled in turn), then reset the engine: the Triton kernels of every kind of step are
        compiled before the first real request (server/engine/warmup.py). Progress goes to stderr
        on a terminal, the summary line always, as the graph capture's."""
        start = time.perf_counter()
        live = sys.stderr.isatty()
        sched = self.config.scheduler
        lengths = [n for n in warmup_waves(self.max_model_len, sched.max_num_batched_tokens)
                   if self.blocks.blocks_needed(n + DECODE_TOKENS) <= self.blocks.num_blocks]
        for i, n in enumerate(lengths):
            if live:
                print(f"\rengine: warming up kernels {i + 1}/{len(lengths)} (a prompt of {n} tokens)", end="",
                      file=sys.stderr, flush=True)
            params = SamplingParams(max_tokens=DECODE_TOKENS, temperature=1.0 if i % 2 else 0.0, top_p=0.9,
                                    ignore_eos=True)
            self.add_request(AddRequest(f"warmup-{i}", prompt_ids(n, self.vocab_size, i), params, 0.0))
            while self.has_unfinished():
                self.step()
        self._reset()
        self.warmup_seconds = time.perf_counter() - start
        if live:
            print(file=sys.stderr)
        print(f"engine: warmed up {len(lengths)} kinds of prefill step (prompts of {','.join(map(str, lengths))} "
              f"tokens) in {self.warmup_seconds:.1f} s", file=sys.stderr, flush=True)

    def _compiled_while_serving(self, kernel: str) -> None:
        self.compiles_while_serving += 1
        log_compile_while_serving(kernel)

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, req: AddRequest) -> None:
        """Queue a request; ValueError (changing nothing) if it is invalid or can never fit."""
        p, prompt = req.params, req.prompt_token_ids
        if req.request_id in self.seqs:
            raise ValueError(f"request_id {req.request_id!r} is already in the engine")
        if not prompt:
            raise ValueError("prompt is empty: it needs at least one token")
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if p.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {p.max_tokens}")
        if not 0 <= p.min_tokens <= p.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={p.max_tokens}], got {p.min_tokens}")
        if p.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {p.temperature}")
        if not 0 < p.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p.top_p}")
        total = len(prompt) + p.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({p.max_tokens}) = {total} "
                             f"exceeds the model's context length {self.max_model_len}")
        if self.spec is not None:
            self.spec.check(p)
        if self.blocks.blocks_needed(total) > self.blocks.num_blocks:
            raise ValueError(f"prompt + max_tokens = {total} tokens needs {self.blocks.blocks_needed(total)} KV "
                             f"blocks but the whole cache has {self.blocks.num_blocks}")
        seq = Sequence(req.request_id, list(prompt), p, req.arrival_time)
        self.seqs[req.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks now; the next `step` reports it finished with
        reason "abort". Unknown or already finished ids are ignored."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.finish(seq, "abort")
        self._forget(request_id)
        self._aborted.append(self._output(seq, ()))

    def has_unfinished(self) -> bool:
        """True while any request is queued or running, or an abort is still to be reported."""
        return self.scheduler.has_unfinished() or bool(self._aborted) or self._in_flight is not None

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> StepOutputs:
        start = time.perf_counter()
        outputs, self._aborted = self._aborted, []
        batch = self.scheduler.schedule()
        if self.spec is not None and not self.overlap:
            if batch:
                new_tokens = self._run_speculative(batch)
                self._planted_delay()
                self._report(batch.seqs, new_tokens, outputs)
        else:
            launched = self._launch(batch) if batch else None
            if batch:
                self._planted_delay()
            if self.overlap:
                launched, self._in_flight = self._in_flight, launched
            if launched is not None:
                self._report(launched.batch.seqs, self._resolve(launched), outputs)
        self._step_time = time.perf_counter() - start
        return StepOutputs(tuple(outputs), self.stats())

    def _planted_delay(self) -> None:
        if self.config.step_delay_ms:  # test-only planted slowdown (--step-delay-ms)
            time.sleep(self.config.step_delay_ms / 1000.0)

    def _report(self, seqs: tuple[Sequence, ...], new_tokens: list[list[int]], outputs: list[RequestOutput]) -> None:
        """Append the outputs of requests that gained tokens; forget the ones that finished."""
        for seq, new in zip(seqs, new_tokens):
            if not new:
                continue
            if not seq.num_reported_tokens:
                self._prompt_tokens += seq.num_prompt_tokens
            seq.num_reported_tokens += len(new)
            self._generation_tokens += len(new)
            outputs.append(self._output(seq, tuple(new)))
            if seq.is_finished:
                del self.seqs[seq.request_id]
                self._forget(seq.request_id)

    def _run_speculative(self, batch: ScheduledBatch) -> list[list[int]]:
        """Verify the batch's drafts, commit the results, propose the next drafts; the tokens each
        request gained."""
        assert self.spec is not None
        verdicts = self.spec.execute(batch)
        new_tokens = self.scheduler.commit(batch, [v.emitted for v in verdicts], [v.num_rejected for v in verdicts])
        self.spec.propose(batch.seqs, verdicts)
        return new_tokens

    def _launch(self, batch: ScheduledBatch) -> LaunchedStep:
        """Run the model and the sampler on the batch without waiting for either. Tokens still
        pending from the step in flight are taken from its sampled tensor on the device."""
        pending = None if self._in_flight is None else self._in_flight.sampled
        if self.spec is not None:
            return self.spec.launch(batch, self.scheduler, pending, self._token_copies)
        num_logits = [1 if s.num_computed_tokens + n == len(s) else 0
                      for s, n in zip(batch.seqs, batch.num_new_tokens)]
        sampling = [s for s, k in zip(batch.seqs, num_logits) if k]
        logits = self.runner.execute(batch, num_logits, pending)
        sampled = self.sampler(logits, sampling, argmax=self.runner.graph_argmax(logits)) if sampling else None
        on_host = None if sampled is None else self.runner.graph_tokens_on_host(sampled)
        return LaunchedStep(batch, self.scheduler.launch(batch, num_logits), sampled, self._token_copies, on_host)

    def _resolve(self, launched: LaunchedStep) -> list[list[int]]:
        """Read a launched step's tokens (the step's one host sync) and account them."""
        if launched.verify is not None:
            assert self.spec is not None
            return self.spec.resolve(launched, self.scheduler)
        return self.scheduler.resolve(launched.batch, launched.placeholder_at, launched.tokens())

    def _forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)
        if self.spec is not None:
            self.spec.forget(request_id)

    def _output(self, seq: Sequence, new_tokens: tuple[int, ...]) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=new_tokens, finished=seq.is_finished,
            finish_reason=seq.finish_reason, num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens, num_drafts=seq.num_drafts,
            num_draft_tokens=seq.num_draft_tokens, num_accepted_tokens=seq.num_accepted_tokens,
        )

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=len(s.running), num_waiting=len(s.waiting), kv_cache_usage=self.blocks.usage,
            prefix_cache_queries=s.prefix_queries, prefix_cache_hits=s.prefix_hits,
            num_preemptions=s.num_preemptions, prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens, step_time_s=self._step_time,
            kernel_compiles=self.compiles_while_serving, **self._spec_stats(),
        )

    def _spec_stats(self) -> dict:
        if self.spec is None:
            return {}
        return dict(spec_num_drafts=self.spec.num_drafts, spec_num_draft_tokens=self.spec.num_draft_tokens,
                    spec_num_accepted_tokens=self.spec.num_accepted_tokens,
                    spec_accepted_per_position=tuple(self.spec.accepted_per_position))

    def check_invariants(self) -> None:
        """Block accounting (free + in use == total, reference counts match live requests)."""
        self.blocks.check_invariants(self.scheduler.running + list(self.scheduler.waiting))
