"""Absorbed Multi-head Latent Attention with the DSA lightning indexer and top-k sparse attention.

One call handles any mix of prefill chunks, decodes and multi-token queries: every token in the
batch first writes its latent KV row and indexer key into the paged cache, then scores the
keys of positions 0..p of its own request (its context, including itself), keeps the top-k,
and attends to exactly those rows. Causality therefore comes from the indexer's context
lengths, and prefill and decode are the same code path through the kernels API.

Under tensor parallelism each rank runs its share of the attention heads and of the indexer's
heads; the latent row and the indexer key are per token, shared by every head, so every rank
computes and caches all of them (see server/distributed/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kernels.attention_prep import indexer_prepare, mla_prepare_
from kernels.gemv import head_linear
from kernels.indexer import indexer_logits_paged
from kernels.sparse_mla import sparse_mla
from kernels.topk import topk_slots
from server.config import ModelConfig
from server.distributed.collectives import TensorParallel
from server.model.layers import (
    ColumnParallelLinear,
    FusedLinears,
    GraphBranch,
    OwnsFusedLinears,
    RMSNorm,
    RopeAngles,
    RowParallelLinear,
)


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-batch tensors shared by every layer; T tokens from B requests."""

    positions: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T], global cache slot of each token
    seq_ids: torch.Tensor  # int32 [T], row of block_table
    context_lens: torch.Tensor  # int32 [T], positions + 1
    block_table: torch.Tensor  # int32 [B, max_blocks]
    block_size: int
    logits_width: int  # the indexer logits' columns: logits_width(max(context_lens)), known on the host


# The indexer logits' width is a kernel argument (their row stride) of the indexer and the top-k:
# rounded up so that it and the top-k's bitmap words (width / 32) stay multiples of 16, it keeps
# one Triton specialisation across steps (server/engine/warmup.py says why that matters).
LOGITS_WIDTH_MULTIPLE = 512


def logits_width(max_context: int) -> int:
    """The logits' columns for a batch whose longest context is max_context."""
    return -(-max_context // LOGITS_WIDTH_MULTIPLE) * LOGITS_WIDTH_MULTIPLE


@dataclass(frozen=True)
class CacheSettings:
    kv_dtype: str  # kernels' name: "bf16" or "fp8_ds_mla"
    key_dtype: str  # "fp8" or "mxfp4"
    backend: str  # "torch", "triton" or "gluon" (kernels/backend.py)


# Steps of up to this many tokens run the attention's latent side beside its indexer side in a
# CUDA graph (MLAttention.forward): a small step leaves most of the GPU idle, so the two sides
# overlap; in a larger one the indexer's own kernels fill the GPU and the branch only adds its
# synchronisation. `benchmarks/engine.py --batches 1,32,128` times decode steps either side of it.
BRANCH_MAX_TOKENS = 32


class Indexer(nn.Module):
    """Lightning indexer: scores every visible key for each query token (docs/sparse_mla.md, step 3).
    Its projections share their inputs with MLA's (wq reads the query latent, wk and weights_proj
    the layer input): MLAttention runs them inside its fused GEMMs and passes their outputs in."""

    def __init__(self, c: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.num_heads = c.index_num_heads // tp.world_size  # this rank's heads
        self.head_dim, self.rope_dim = c.index_head_dim, c.qk_rope_dim
        # The logit weight's scale counts every head of the model, not this rank's share.
        self.weight_scale = (c.index_num_heads * c.index_head_dim) ** -0.5
        self.wq = ColumnParallelLinear(c.q_lora_rank, c.index_num_heads * c.index_head_dim, tp)
        self.wk = nn.Linear(c.hidden_size, c.index_head_dim, bias=False)
        self.k_norm = nn.LayerNorm(c.index_head_dim, eps=c.rms_norm_eps)
        self.weights_proj = ColumnParallelLinear(c.hidden_size, c.index_num_heads, tp)

    def forward(self, query: torch.Tensor, key: torch.Tensor, head_weights: torch.Tensor, rope: RopeAngles,
                meta: AttentionMetadata, idx_cache: torch.Tensor, s: CacheSettings) -> torch.Tensor:
        """query: wq of the query latent; key, head_weights: wk and weights_proj of the layer input."""
        q8, weights = indexer_prepare(
            query.view(query.shape[0], self.num_heads, self.head_dim), key, head_weights, self.k_norm.weight,
            self.k_norm.bias, self.k_norm.eps, rope.cos, rope.sin, self.rope_dim, idx_cache, meta.slot_mapping,
            s.key_dtype, self.weight_scale, backend=s.backend)
        partial = indexer_logits_paged(
            q8, weights, idx_cache, s.key_dtype, meta.block_table, meta.block_size, meta.seq_ids,
            meta.context_lens, meta.logits_width, backend=s.backend, mask_tail=False)
        # Columns past a token's context stay unwritten (mask_tail=False): top-k reads a row only up
        # to its context length. A logit is a sum over heads: summing the ranks' partial sums gives every rank the same
        # logits, hence the same top-k (-inf + -inf stays -inf where keys are masked).
        return self.tp.all_reduce(partial)


class MLAttention(OwnsFusedLinears):
    """Absorbed MLA: W_UK folded into the query, W_UV applied to the attended latent."""

    def __init__(self, c: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.c = c
        self.num_heads = c.num_heads // tp.world_size  # this rank's heads
        h = c.num_heads
        self.wq_a = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.wq_b = ColumnParallelLinear(c.q_lora_rank, h * (c.qk_nope_dim + c.qk_rope_dim), tp)
        self.wkv_a = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_dim, bias=False)
        self.kv_norm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        # Per head: W_UK rows (d_nope) then W_UV rows (d_v), each over the latent d_c. Head-major
        # rows, so a rank's contiguous slice is whole heads.
        self.wkv_b = ColumnParallelLinear(c.kv_lora_rank, h * (c.qk_nope_dim + c.v_head_dim), tp)
        self.wo = RowParallelLinear(h * c.v_head_dim, c.hidden_size, tp)
        self.indexer = Indexer(c, tp)
        # The linears that read one input run as one GEMM each (see FusedLinears): the four that
        # read the layer input, and the two that read the query latent.
        self.input_proj = FusedLinears(self.wq_a, self.wkv_a, self.indexer.wk, self.indexer.weights_proj)
        self.query_proj = FusedLinears(self.wq_b, self.indexer.wq)

    def forward(self, inputs: torch.Tensor, rope: RopeAngles, meta: AttentionMetadata,
                kv_cache: torch.Tensor, idx_cache: torch.Tensor, s: CacheSettings) -> torch.Tensor:
        """inputs: `input_proj` of the normed layer input, which the caller computes with the norm
        (`RMSNorm.add_project` over `input_proj.weight`)."""
        c, t, h = self.c, inputs.shape[0], self.num_heads
        b = s.backend
        q_latent, kv, index_key, index_weights = inputs.split(self.input_proj.sizes, dim=-1)
        q, index_query = self.q_norm.project(q_latent, self.query_proj.weight, b).split(self.query_proj.sizes, dim=-1)
        q = q.view(t, h, c.qk_nope_dim + c.qk_rope_dim)
        q_nope, q_pe = q.split([c.qk_nope_dim, c.qk_rope_dim], dim=-1)
        latent, k_pe = kv.split([c.kv_lora_rank, c.qk_rope_dim], dim=-1)
        w_kv = self.wkv_b.weight.view(h, c.qk_nope_dim + c.v_head_dim, c.kv_lora_rank)
        w_uk, w_uv = w_kv.split([c.qk_nope_dim, c.v_head_dim], dim=1)
        # The latent side (the KV row written, q_pe rotated, W_UK absorbed into the query) does not
        # depend on the indexer's side (key written, logits, top-k, slots) until the sparse
        # attention: in a graph of up to BRANCH_MAX_TOKENS tokens the two run side by side.
        with GraphBranch(inputs.device, enabled=t <= BRANCH_MAX_TOKENS) as latent_side:
            mla_prepare_(q_pe, latent, k_pe, self.kv_norm.weight, self.kv_norm.eps, rope.cos, rope.sin, kv_cache,
                         meta.slot_mapping, s.kv_dtype, backend=s.backend)
            # W_UK absorbed (einsum "thn,hnc->thc": a product over W_UK's rows, so its transposed
            # view); q_pe stays where it is
            q_latent_abs = head_linear(q_nope, w_uk.transpose(1, 2), b)

        logits = self.indexer(index_query, index_key, index_weights, rope, meta, idx_cache, s)
        slots = topk_slots(logits, meta.context_lens, c.index_topk, meta.block_table, meta.seq_ids, meta.block_size,
                           backend=s.backend)
        latent_side.join(q_latent_abs)
        o_lat, _ = sparse_mla(q_latent_abs.to(torch.bfloat16), kv_cache, slots, c.softmax_scale, c.kv_lora_rank,
                              s.kv_dtype, backend=b, q_rope=q_pe.to(torch.bfloat16))
        o = head_linear(o_lat.to(inputs.dtype), w_uv, b)  # einsum "thc,hvc->thv"
        return self.wo(o.reshape(t, h * c.v_head_dim), b)
