"""The life of a worker rank's process: join the group, build this rank's shard, run the steps
rank 0 broadcasts until told to stop; end with the engine process if it vanishes."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import torch

from server.config import EngineConfig
from server.log import configure_logging
from server.parallel.collectives import TensorParallel
from server.parallel.settings import collective_timeout_s, disable_multicast, step_timeout_s

log = logging.getLogger(__name__)


def worker_main(config: EngineConfig, rank: int, local_rank: int, addr: str, port: int,
                num_threads: int, parent_pid: int | None, acks: Any = None) -> None:
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
        from server.model.runner import ModelRunner

        tp = TensorParallel(rank, config.parallel.tensor_parallel_size, local_rank)
        tp.acks = acks
        tp.connect(config, addr, port, collective_timeout_s(step_timeout_s()))
        ModelRunner(config, tp).serve()
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
