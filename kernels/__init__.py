"""Sparse-MLA kernels in portable Triton, each with its torch reference: indexer logits, top-k, sparse MLA, quantisation."""
