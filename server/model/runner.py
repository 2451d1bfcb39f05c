"""Runs one scheduled batch through the model: sizes and owns the KV cache, builds batch inputs.

Batch metadata is built with a handful of tensor operations over the whole batch (no per-token
Python), on the host, and moved to the device in three asynchronous copies. A request may contribute any number
of query tokens in a step (a prefill chunk, one decode token, or k+1 tokens to verify drafts);
`num_logits` says for how many of its last tokens the caller wants logits.
"""

from __future__ import annotations

import torch

from server.config import EngineConfig, resolve_backend, resolve_device
from server.engine.kv_cache import KVCacheTensors, cache_bytes_per_token, kernel_kv_dtype
from server.engine.scheduler import ScheduledBatch
from server.model.attention import AttentionMetadata, CacheSettings
from server.model.model import build_model


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(resolve_device(config.device))
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = build_model(config.model, self.device, self.dtype, config.seed, config.weights)
        self.block_size = config.cache.block_size
        self.num_blocks = self._num_blocks()
        self.cache = KVCacheTensors.allocate(config.model, config.cache, self.num_blocks, self.device)
        self.settings = CacheSettings(
            kv_dtype=kernel_kv_dtype(config.cache),
            key_dtype=config.cache.indexer_key_dtype,
            backend=resolve_backend(config.attention_backend, config.device),
        )

    def _num_blocks(self) -> int:
        cache, sched = self.config.cache, self.config.scheduler
        if cache.num_blocks is not None:
            return cache.num_blocks
        block_bytes = cache_bytes_per_token(self.config.model, cache) * self.block_size
        if self.device.type == "cpu":
            budget, flag = cache.kv_cache_gb * 2**30, "--kv-cache-gb"
        else:
            total = torch.cuda.get_device_properties(self.device).total_memory
            # Peak step temporaries: indexer logits and top-k copies over the longest context.
            activations = 4 * 4 * sched.max_num_batched_tokens * sched.max_model_len + 2**30
            budget = total * cache.gpu_memory_utilization - torch.cuda.memory_allocated(self.device) - activations
            flag = "--gpu-memory-utilization"
        num_blocks = int(budget // block_bytes)
        if num_blocks < 1:
            raise ValueError(f"{flag}: leaves no room for a single KV block ({block_bytes} bytes)")
        return num_blocks

    def prepare(self, batch: ScheduledBatch, num_logits: list[int]) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        """(input ids [T], metadata, indices of the tokens whose logits are wanted)."""
        seqs, counts = batch.seqs, batch.num_new_tokens
        starts = [s.num_computed_tokens for s in seqs]
        ids: list[int] = []
        for s, start, n in zip(seqs, starts, counts):
            ids.extend(s.token_ids[start:start + n])
        width = max(len(s.block_ids) for s in seqs)
        table = torch.tensor([s.block_ids + [0] * (width - len(s.block_ids)) for s in seqs], dtype=torch.int32)

        counts_t = torch.tensor(counts)
        num_tokens = len(ids)
        seq_ids = torch.repeat_interleave(torch.arange(len(seqs)), counts_t, output_size=num_tokens)
        first = torch.cumsum(counts_t, 0) - counts_t
        positions = torch.tensor(starts)[seq_ids] + torch.arange(num_tokens) - first[seq_ids]
        slots = table[seq_ids, positions // self.block_size].long() * self.block_size + positions % self.block_size
        ends = (first + counts_t).tolist()
        wanted = [i for end, k in zip(ends, num_logits) for i in range(end - k, end)]
        dev = self._to_device(torch.stack((torch.tensor(ids), positions, seq_ids, slots)))
        meta = AttentionMetadata(
            positions=dev[1], slot_mapping=dev[3], seq_ids=dev[2].int(), context_lens=(dev[1] + 1).int(),
            block_table=self._to_device(table), block_size=self.block_size,
            max_context=max(start + n for start, n in zip(starts, counts)),
        )
        return dev[0], meta, self._to_device(torch.tensor(wanted, dtype=torch.long))

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """Asynchronous copy (from pinned memory, so it neither blocks nor syncs the stream)."""
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, num_logits: list[int]) -> torch.Tensor:
        """Logits fp32 [sum(num_logits), vocab] on the device, in batch order."""
        return self.execute_with_hidden(batch, num_logits)[0]

    @torch.inference_mode()
    def execute_with_hidden(self, batch: ScheduledBatch, num_logits: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, final hidden states [sum(num_logits), hidden]) of the same tokens; the
        speculative draft head continues from the hidden states."""
        input_ids, meta, wanted = self.prepare(batch, num_logits)
        hidden = self.model(input_ids, meta, self.cache.kv, self.cache.indexer, self.settings)[wanted]
        return self.model.logits(hidden), hidden
