"""Tensor parallelism over torch.distributed, one process per rank.

- collectives.py: `TensorParallel`, a rank's place in the group: the collectives the sharded
  model calls (what server/model imports) and the per-step broadcast from the engine core;
- supervisor.py: rank 0's side of the worker ranks of its node: start them, watch them
  (a watchdog names a rank that died or hung), stop them;
- worker.py: the entry point of a worker rank's process, which serves the steps with the engine's
  model runner (handed in by the runner, so that this package does not import the engine);
- settings.py: process-wide switches every rank applies (NCCL multicast off, step timeout).

The engine core is rank 0: it runs the scheduler and the sampler, and its ModelRunner starts
the other ranks of its node ('spawn' processes); the ranks of other nodes come from
`python -m server.parallel` (server/parallel/launcher.py). Every step, rank 0 broadcasts the
batch inputs (a fixed header of shapes, then one int64 payload) over a gloo group; every rank
runs the forward pass on its shard, joining the all-reduces inside the model; rank 0 alone
receives the full logits. Collectives of the forward pass go over NCCL on GPUs and gloo on CPU.

What is split and what is replicated (Megatron-style):
- attention heads (wq_b, wkv_b per-head rows; wo row-parallel + all-reduce) and the indexer's
  heads (wq, weights_proj rows; the logits are a sum over heads, so the partial logits are
  all-reduced before top-k: T x context fp32 per layer, the price of splitting its compute);
- the MLP (gate/up column-parallel, down row-parallel + all-reduce) and the LM head (vocabulary
  slices gathered to rank 0; rank 0 also keeps the whole head for the speculative draft head,
  which runs on rank 0 alone on the replicated hidden states);
- replicated: the embedding (a lookup costs nothing, and replicating it saves an all-reduce per
  step), the latent projections and norms, and both caches: the latent KV row [c ; k_pe] and the
  indexer key are one per token shared by every head (MQA), so each rank holds all of them and
  writes the same rows (vLLM does the same for MLA).

docs/architecture.md describes the process model as a whole.
"""
