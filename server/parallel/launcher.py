"""`python -m server.parallel`: the tensor-parallel ranks of one node other than node 0.

Give the same engine flags as `server start --nnodes N` and this node's --node-rank. It starts the
node's ranks itself, or, under `torchrun --standalone --nproc-per-node M` (or any launcher that
starts one process per local rank and sets LOCAL_RANK), runs one rank per process: global rank =
node_rank * M + LOCAL_RANK.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys

import torch

from server.args import add_engine_args, engine_config_from_args
from server.distributed.settings import disable_multicast
from server.distributed.worker import worker_main
from server.engine.model_runner import serve_worker_rank
from server.log import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server.parallel",
        description="Run the tensor-parallel ranks of one node (--node-rank >= 1) of a `server start "
                    "--nnodes N` engine; give the same engine flags as the server. Starts the node's "
                    "--tp/--nnodes ranks itself, or, under a launcher that starts one process per "
                    "local rank and sets LOCAL_RANK (torchrun --standalone --nproc-per-node M), "
                    "runs rank --node-rank * M + LOCAL_RANK in this process.")
    add_engine_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        config = engine_config_from_args(parser.parse_args(argv))
        p = config.parallel
        if p.nnodes < 2 or p.node_rank < 1:
            raise ValueError("--nnodes must be at least 2 and --node-rank at least 1 (node 0 runs `server start`)")
        per_node = p.tensor_parallel_size // p.nnodes
        local_rank = os.environ.get("LOCAL_RANK")
        if local_rank is not None and not (local_rank.isdigit() and int(local_rank) < per_node):
            raise ValueError(f"LOCAL_RANK={local_rank!r}: must be in 0..{per_node - 1} "
                             "(--tp / --nnodes ranks per node)")
        configure_logging()
    except ValueError as exc:
        print(f"server.parallel: error: {exc}", file=sys.stderr)
        return 2
    disable_multicast()
    first = p.node_rank * per_node
    if local_rank is not None:
        worker_main(config, first + int(local_rank), int(local_rank), p.master_addr, p.master_port,
                    torch.get_num_threads(), None, serve_worker_rank)
        return 0
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker_main, args=(config, first + i, i, p.master_addr, p.master_port,
                                                   max(1, torch.get_num_threads() // per_node), None,
                                                   serve_worker_rank))
             for i in range(per_node)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return int(any(proc.exitcode != 0 for proc in procs))
