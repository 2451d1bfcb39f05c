"""Runs one scheduled batch through the model: sizes and owns the KV cache, builds batch inputs.

Batch metadata is built with a handful of tensor operations over the whole batch (no per-token
Python), on the host, and moved to the device in three asynchronous copies (one, for a step that
a CUDA graph replays). A request may contribute any number of query tokens in a step (a prefill
chunk, one decode token, or k+1 tokens to verify drafts); `num_logits` says for how many of its
last tokens the caller wants logits.

Under tensor parallelism (`--tp N`) the engine core's runner is rank 0: it starts the other ranks,
broadcasts each step's host inputs to them, and alone gets the logits; a worker rank's runner
loops in `serve`, running the steps it receives (see server/distributed/).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from kernels.backend import runs_compiled_kernels
from kernels.quant import check_slot_range
from server.config import EngineConfig, resolve_backend, resolve_device
from server.distributed.collectives import TensorParallel
from server.engine.block_table import BlockTable
from server.engine.cuda_graph import DecodeGraphs, default_capture_sizes
from server.engine.kv_cache import KVCacheTensors, cache_bytes_per_token, kernel_kv_dtype
from server.engine.pending import fill_placeholders, to_device_async
from server.engine.scheduler import ScheduledBatch
from server.model.attention import AttentionMetadata, CacheSettings, logits_width
from server.model.model import build_model

log = logging.getLogger(__name__)

# Said at start-up: users pick MXFP4 keys to reproduce a result measured on FP4 tensor cores.
MXFP4_NOTE = ("--indexer-key-dtype mxfp4: this engine's kernels decode MXFP4 keys in software (no FP4 tensor-core "
              "path), slower than its fp8 keys, so an fp8-vs-MXFP4 A/B on this server measures these kernels, "
              "not the format's half-size keys")


@dataclass(frozen=True)
class StepInputs:
    """One step's batch on the host: what rank 0 broadcasts to the other ranks."""

    token_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    seq_ids: torch.Tensor  # int64 [T], row of block_table
    slots: torch.Tensor  # int64 [T], global cache slot of each token
    block_table: torch.Tensor  # int32 [B, max_blocks]
    wanted: torch.Tensor  # int64 [N], tokens whose logits are wanted
    max_context: int
    # q when every request computes q tokens and wants all their logits (decode, or verification
    # of as many drafts each): the shape a captured graph replays; 0 otherwise.
    uniform_query_len: int

    def to_wire(self) -> list[torch.Tensor]:
        return [torch.stack((self.token_ids, self.positions, self.seq_ids, self.slots)),
                self.block_table.long(), self.wanted, torch.tensor([self.max_context, self.uniform_query_len])]

    @classmethod
    def from_wire(cls, tensors: list[torch.Tensor]) -> StepInputs:
        per_token, table, wanted, scalars = tensors
        token_ids, positions, seq_ids, slots = per_token
        return cls(token_ids, positions, seq_ids, slots, block_table=table.int(), wanted=wanted,
                   max_context=int(scalars[0]), uniform_query_len=int(scalars[1]))


class ModelRunner:
    def __init__(self, config: EngineConfig, tp: TensorParallel | None = None) -> None:
        """tp: a worker rank's joined group; None for the engine core, which is rank 0 and
        starts the other ranks itself when --tp > 1."""
        self.config = config
        size = config.parallel.tensor_parallel_size
        self.tp = tp or TensorParallel(0, size, 0)
        self.device = torch.device(resolve_device(config.device))
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.tp.local_rank)
        self.num_gpus = size if self.device.type == "cuda" else 0
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        # Rank 0 builds (and so validates the weights) before any other rank exists.
        self.model = build_model(config.model, self.device, self.dtype, config.seed, config.weights, self.tp)
        if tp is None and size > 1:
            self.tp.start_workers(config, serve_worker_rank)
        self.block_size = config.block_size
        self.block_table = BlockTable()
        # Rank 0's block manager hands out slots that every rank's cache must hold.
        self.settings = CacheSettings(
            kv_dtype=kernel_kv_dtype(config.cache),
            key_dtype=config.cache.indexer_key_dtype,
            backend=resolve_backend(config.attention_backend, config.device),
        )
        if self.settings.key_dtype == "mxfp4" and self.tp.rank == 0:
            log.warning(MXFP4_NOTE)
        use_graphs = self._use_graphs()
        self.num_blocks = self.tp.agree_min(self._num_blocks(use_graphs))
        # A graph's padding rows need a cache block no request owns: one more, past the block manager's.
        self.cache = KVCacheTensors.allocate(config, self.num_blocks + use_graphs, self.device)
        self.graphs: DecodeGraphs | None = None
        if use_graphs:
            self.graphs = DecodeGraphs(
                self.model, self.cache.kv, self.cache.indexer, self.settings, self.block_size, config.max_model_len,
                dummy_block=self.num_blocks,
                sizes=config.cuda_graph_sizes or default_capture_sizes(config.scheduler.max_num_seqs),
                max_pending=config.max_step_outputs,
                query_lens=(1,) if config.speculative is None else (1, config.num_speculative_tokens + 1))
            self.graphs.capture()

    @property
    def compiles_kernels(self) -> bool:
        """Whether steps run kernels that compile on first use: on CUDA with any backend but torch."""
        return self.device.type == "cuda" and runs_compiled_kernels(self.settings.backend)

    def _use_graphs(self) -> bool:
        """CUDA graphs for decode steps: where the kernels are compiled ones (compiles_kernels) at --tp 1,
        unless --enforce-eager."""
        return not self.config.enforce_eager and self.compiles_kernels and self.tp.world_size == 1

    def _num_blocks(self, use_graphs: bool) -> int:
        cache, sched = self.config.cache, self.config.scheduler
        if cache.num_blocks is not None:
            return cache.num_blocks
        block_bytes = cache_bytes_per_token(self.config.model, cache) * self.block_size
        if self.device.type == "cpu":
            budget, flag = cache.kv_cache_gb * 2**30, "--kv-cache-gb"
        else:
            total = torch.cuda.get_device_properties(self.device).total_memory
            # Peak step temporaries: indexer logits and top-k copies over the longest context; the
            # decode graphs' private pool holds the same for max_num_seqs rows.
            rows = sched.max_num_batched_tokens + (sched.max_num_seqs if use_graphs else 0)
            activations = 4 * 4 * rows * self.config.max_model_len + 2**30
            budget = total * cache.gpu_memory_utilization - torch.cuda.memory_allocated(self.device) - activations
            flag = "--gpu-memory-utilization"
        num_blocks = int(budget // block_bytes)
        if num_blocks < 1:
            raise ValueError(f"{flag}: leaves no room for a single KV block ({block_bytes} bytes)")
        return num_blocks

    def step_inputs(self, batch: ScheduledBatch, num_logits: list[int]) -> StepInputs:
        """The batch's host-side inputs. Token ids may hold placeholders (< 0) for tokens the step
        in flight is sampling (server/engine/pending.py); the device fills them in."""
        seqs, counts = batch.seqs, batch.num_new_tokens
        starts = [s.num_computed_tokens for s in seqs]
        table = self.block_table.build(seqs)
        q = counts[0] if all(n == counts[0] for n in counts) and num_logits == list(counts) else 0
        if q == 1:  # decode: one token per request, built from plain lists (numpy: a torch op costs more)
            positions = np.array(starts)
            rows = np.arange(len(seqs))
            rows_t = torch.from_numpy(rows)  # each request's table row, and its logits' row
            return StepInputs(
                torch.from_numpy(np.array([s.token_ids[p] for s, p in zip(seqs, starts)])), torch.from_numpy(positions),
                rows_t, self._slots(table, rows, positions), torch.from_numpy(table), rows_t, max(starts) + 1, q)
        ids: list[int] = []
        for s, start, n in zip(seqs, starts, counts):
            ids.extend(s.token_ids[start:start + n])
        # numpy, as for decode: a verify step or prefill chunk takes a few array operations
        counts_np, wants = np.array(counts), np.array(num_logits)
        seq_ids = np.repeat(np.arange(len(seqs)), counts_np)
        first = np.cumsum(counts_np) - counts_np
        positions = np.array(starts)[seq_ids] + np.arange(len(ids)) - first[seq_ids]
        # each request's last num_logits[i] tokens, in batch order
        wanted_first = np.cumsum(wants) - wants  # a request's first row among the wanted
        wanted = np.repeat(first + counts_np - wants - wanted_first, wants) + np.arange(wants.sum())
        return StepInputs(torch.tensor(ids, dtype=torch.long), torch.from_numpy(positions), torch.from_numpy(seq_ids),
                          self._slots(table, seq_ids, positions), torch.from_numpy(table), torch.from_numpy(wanted),
                          max(start + n for start, n in zip(starts, counts)), q)

    def _slots(self, table: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> torch.Tensor:
        """int64 global cache slot of each token: its request's block at the position, and the offset."""
        bs = self.block_size
        return torch.from_numpy(table[rows, positions // bs].astype(np.int64) * bs + positions % bs)

    def _on_device(self, inputs: StepInputs,
                   pending: torch.Tensor | None) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        dev = self._to_device(torch.stack((inputs.token_ids, inputs.positions, inputs.seq_ids, inputs.slots)))
        meta = AttentionMetadata(
            positions=dev[1], slot_mapping=dev[3], seq_ids=dev[2].int(), context_lens=(dev[1] + 1).int(),
            block_table=self._to_device(inputs.block_table), block_size=self.block_size,
            logits_width=logits_width(inputs.max_context),
        )
        input_ids = dev[0] if pending is None else fill_placeholders(dev[0], pending)
        return input_ids, meta, self._to_device(inputs.wanted)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        return to_device_async(host, self.device)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, num_logits: list[int],
                pending: torch.Tensor | None = None) -> torch.Tensor:
        """Logits fp32 [sum(num_logits), vocab] on the device, in batch order. pending: the sampled
        tokens (device) of the step in flight, which the batch's placeholders stand for."""
        return self.execute_with_hidden(batch, num_logits, pending)[0]

    def graph_argmax(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax of `logits` returned by the last `execute` when a decode graph
        computed it with them (int64, on the device), else None (server/engine/cuda_graph.py)."""
        return None if self.graphs is None else self.graphs.argmax_of(logits)

    def graph_tokens_on_host(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The host copy of `tokens` that the decode graph made when they are its argmax
        (`graph_argmax`), valid once the step is done; None otherwise."""
        return None if self.graphs is None else self.graphs.argmax_on_host(tokens)

    @torch.inference_mode()
    def execute_with_hidden(self, batch: ScheduledBatch, num_logits: list[int],
                            pending: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, final hidden states [sum(num_logits), hidden]) of the same tokens; the
        speculative draft head continues from the hidden states."""
        inputs = self.step_inputs(batch, num_logits)
        if self.tp.world_size == 1:
            logits, hidden = self._forward(inputs, pending)
        else:
            logits, hidden = self._forward_with_workers(inputs, pending)
        assert logits is not None  # the engine core is rank 0, which gathers the whole vocabulary
        return logits, hidden

    def _forward_with_workers(self, inputs: StepInputs,
                              pending: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Rank 0 under tensor parallelism: send the step to the other ranks and run it with them."""
        if pending is not None:
            raise ValueError("ModelRunner: placeholder tokens under tensor parallelism (the other ranks "
                             "embed the token ids themselves); overlapped scheduling is off at --tp > 1")
        self.tp.step_started()
        try:
            self.tp.send_step(inputs.to_wire())
            out = self._forward(inputs)
            self._wait_for_device()
        except Exception as exc:  # a collective failed: name the dead rank if there is one
            raise self.tp.failure(exc) from exc
        self.tp.step_finished()
        return out

    def _forward(self, inputs: StepInputs,
                 pending: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        # The cache writers check slots only on CPU tensors (on a GPU it costs two host syncs per
        # write, four per layer): the whole step's slots are checked here once, on the host.
        check_slot_range(inputs.slots, self.num_blocks * self.block_size, "ModelRunner: step slots")
        q = inputs.uniform_query_len
        if self.graphs is not None and q and self.graphs.fits(inputs.block_table.shape[0], q):
            return self.graphs.replay(inputs.token_ids, inputs.positions, inputs.seq_ids, inputs.slots,
                                      inputs.block_table, inputs.max_context, pending)
        input_ids, meta, wanted = self._on_device(inputs, pending)
        hidden = self.model(input_ids, meta, self.cache.kv, self.cache.indexer, self.settings)[wanted]
        return self.model.parallel_logits(hidden, self.settings.backend), hidden

    def _wait_for_device(self) -> None:
        """Under TP a step counts as done (for the hang watchdog) only when the device is done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def serve(self) -> None:
        """A worker rank's life: run every step rank 0 broadcasts, until it says stop."""
        while (wire := self.tp.receive_step()) is not None:
            self.tp.step_started()
            self._forward(StepInputs.from_wire(wire))
            self._wait_for_device()
            self.tp.step_finished()

    def close(self) -> None:
        """Stop the other ranks and leave the group (also done at exit); no-op at --tp 1."""
        self.tp.stop()


def serve_worker_rank(config: EngineConfig, tp: TensorParallel) -> None:
    """A worker rank's part once it joined the group: build its shard, run rank 0's steps until told to stop."""
    ModelRunner(config, tp).serve()
