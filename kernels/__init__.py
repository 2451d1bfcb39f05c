"""Sparse-MLA kernels in portable Triton, each with its torch reference: indexer logits, top-k, sparse MLA,
quantisation.

Every op takes backend="triton" | "torch" | "gluon" | None; None means get_backend(): set_backend's
choice, else $AGENTLOAD_KERNEL_BACKEND, else "triton" when CUDA is available and "torch" otherwise.
"gluon" runs sparse MLA's Gluon kernel (sm_90 (Hopper) or gfx942 (CDNA3), never tested on AMD hardware)
and the Triton kernels for every other op. The Triton kernels also run on CPU tensors through the
Triton interpreter: on a machine without a GPU, importing this package sets TRITON_INTERPRET=1
unless it is already set.
"""

from __future__ import annotations

import os

import torch

# Without a GPU Triton can only run interpreted; decide before any kernel module imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.backend import BACKENDS, ENV_VAR, get_backend, set_backend
from kernels.indexer import indexer_logits_paged, indexer_logits_ragged
from kernels.quant import (
    fp8_e4m3_dequantize,
    fp8_e4m3_quantize,
    indexer_row_bytes,
    kv_row_bytes,
    mxfp4_dequantize,
    mxfp4_quantize,
    read_indexer_keys,
    read_kv_rows,
    write_indexer_cache,
    write_kv_cache,
)
from kernels.sparse_mla import sparse_mla
from kernels.topk import positions_to_slots, topk_indices, topk_slots

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "fp8_e4m3_dequantize",
    "fp8_e4m3_quantize",
    "get_backend",
    "indexer_logits_paged",
    "indexer_logits_ragged",
    "indexer_row_bytes",
    "kv_row_bytes",
    "mxfp4_dequantize",
    "mxfp4_quantize",
    "positions_to_slots",
    "read_indexer_keys",
    "read_kv_rows",
    "set_backend",
    "sparse_mla",
    "topk_indices",
    "topk_slots",
    "write_indexer_cache",
    "write_kv_cache",
]
