"""The life of a worker rank's process: join the group, build this rank's shard, run the steps
rank 0 broadcasts until told to stop; end with the engine process if it vanishes.

What the rank runs once joined (`RankServer`) is the engine's model runner, passed in by whoever
starts the process (rank 0's runner, or `python -m server.parallel` on another node): this
package sits below the engine and does not import it."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from server.config import EngineConfig
from server.distributed.collectives import TensorParallel
from server.distributed.settings import collective_timeout_s, disable_multicast, step_timeout_s
from server.log import configure_logging

log = logging.getLogger(__name__)

# Builds this rank's shard and serves rank 0's steps until told to stop; a module-level function,
# so that a 'spawn' process can receive it.
RankServer = Callable[[EngineConfig, TensorParallel], None]


def worker_main(config: EngineConfig, rank: int, local_rank: int, addr: str, port: int,
                num_threads: int, parent_pid: int | None, serve: RankServer, acks: Any = None) -> None:
    """A worker rank: join the group, build this rank's shard, run steps until told to stop.

    acks: rank 0's shared step counters (None under a launcher on another node)."""
    configure_logging()
    # The engine process ignores both; a worker ends on SIGTERM, and Ctrl-C is rank 0's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    disable_multicast()
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    torch.set_num_threads(num_threads)
    try:
        tp = TensorParallel(rank, config.parallel.tensor_parallel_size, local_rank)
        tp.acks = acks
        tp.connect(config, addr, port, collective_timeout_s(step_timeout_s()))
        serve(config, tp)
        tp.disconnect()
    except BaseException:
        log.exception("tensor-parallel rank %d failed", rank)
        logging.shutdown()
        os._exit(1)


def _exit_with_parent(parent_pid: int) -> None:
    """A spawned worker whose engine process vanished (SIGKILL) must not linger in a collective."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()
