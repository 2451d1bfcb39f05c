"""Rank 0's side of the worker ranks of its node: start them, watch them, stop them.

A worker that exits, or a step that has not finished within AGENTLOAD_TP_STEP_TIMEOUT_S (default
120 s), makes the watchdog log which rank and why, stop the others, raise RankFailure in the
engine's thread (so the engine process reports the reason and exits 1, which the API side turns
into 503s, a failing /health and a non-zero exit), and, if that thread is stuck in a collective,
exit 1 itself after a few seconds. When the engine steps on a thread of a process that is not its
own (loadgen bench in-process), the watchdog only ends the peers: the next collective fails and
the owner reports the reason.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait as wait_for_sentinels
from typing import Any

import torch

from server.config import EngineConfig, resolve_device
from server.distributed.collectives import TensorParallel
from server.distributed.settings import STEP_TIMEOUT_ENV, disable_multicast, step_timeout_s
from server.distributed.worker import RankServer, worker_main

log = logging.getLogger(__name__)

# The watchdog interrupts the engine's thread with this signal to raise RankFailure there.
FAILURE_SIGNAL = signal.SIGUSR1
FAILURE_GRACE_S = 5.0


class RankFailure(RuntimeError):
    """A tensor-parallel rank died or hung: no rank can go on without the others."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class Supervisor:
    """Rank 0's handle on its node's workers: their start, the step timing the watchdog reads,
    the verdict after a failed step, and the stop."""

    def __init__(self, tp: TensorParallel, workers: WorkerSet, threads_before: int | None,
                 rendezvous: tuple[str, int], timeout_s: float) -> None:
        self.tp, self.workers, self._threads_before = tp, workers, threads_before
        self.rendezvous, self.timeout_s = rendezvous, timeout_s
        # Runs before multiprocessing's exit hook terminates daemon children, so that the
        # watchdog does not take a clean shutdown for a dead rank.
        self._finalizer = multiprocessing.util.Finalize(self, self._stop, exitpriority=10)

    @classmethod
    def start(cls, tp: TensorParallel, config: EngineConfig, serve: RankServer) -> Supervisor:
        """Start this node's other ranks, each running `serve`; rank 0 then joins the group at `rendezvous`."""
        p = config.parallel
        if p.node_rank != 0:
            raise ValueError(f"--node-rank {p.node_rank}: `server start` is rank 0 and runs on node 0; "
                             "start the other nodes with `python -m server.parallel`")
        disable_multicast()
        timeout = step_timeout_s()
        addr, port = ("127.0.0.1", _free_port()) if p.nnodes == 1 else (p.master_addr, p.master_port)
        per_node = tp.world_size // p.nnodes
        threads_before = None
        if resolve_device(config.device) == "cpu":
            # CPU ranks of one node share its cores: oversubscribed OpenMP threads stall each step.
            threads_before = torch.get_num_threads()
            torch.set_num_threads(max(1, threads_before // per_node))
        workers = WorkerSet.spawn(config, range(1, per_node), addr, port, serve)
        workers.watch(timeout, lambda: tp.steps)
        return cls(tp, workers, threads_before, (addr, port), timeout)

    def step_started(self) -> None:
        self.workers.step_began = time.monotonic()
        self.workers.step_thread = threading.current_thread()

    def step_finished(self) -> None:
        self.workers.step_began = None

    def failure(self, exc: BaseException) -> BaseException:
        if isinstance(exc, RankFailure):
            return exc
        reason = self.workers.failure_reason(wait_s=2.0)
        if reason is None:
            return exc
        self.workers.delivered = True
        return RankFailure(reason)

    def stop(self) -> None:
        """Tell the workers to exit, wait for them (kill stragglers), leave the group. Once."""
        self._finalizer()

    def _stop(self) -> None:
        self.workers.unwatch()
        try:
            self.tp.send_step(None)
        except Exception:  # noqa: BLE001 - a dead peer: the joins below still end every worker
            pass
        self.workers.join_all()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
        self.tp.disconnect()


class WorkerSet:
    """The worker processes of rank 0's node, and the watchdog thread over them."""

    def __init__(self, procs: dict[int, multiprocessing.process.BaseProcess], acks: Any) -> None:
        self.procs = procs
        self.acks = acks  # shared int64 per rank: the last step each worker finished
        self.closing = False
        self.step_began: float | None = None
        self.reason: str | None = None
        self.delivered = False  # the engine's thread has its RankFailure: interrupt it no more
        self._previous_handler: Any = None  # SIGUSR1's handler before ours, when we installed one
        self.step_thread: threading.Thread | None = None  # the thread that runs the engine's steps

    @classmethod
    def spawn(cls, config: EngineConfig, ranks: range, addr: str, port: int, serve: RankServer) -> WorkerSet:
        ctx = multiprocessing.get_context("spawn")
        acks = ctx.Array("q", config.parallel.tensor_parallel_size, lock=False)
        procs: dict[int, multiprocessing.process.BaseProcess] = {}
        for rank in ranks:
            proc = ctx.Process(target=worker_main, name=f"agentload-tp-rank{rank}", daemon=True,
                               args=(config, rank, rank, addr, port, torch.get_num_threads(), os.getpid(), serve, acks))
            proc.start()
            log.info("tensor-parallel rank %d started (pid %d)", rank, proc.pid)
            procs[rank] = proc
        return cls(procs, acks)

    def watch(self, timeout_s: float, steps_sent: Callable[[], int]) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(FAILURE_SIGNAL, self._raise_failure)
        threading.Thread(target=self._watch, args=(timeout_s, steps_sent), name="tp-watchdog",
                         daemon=True).start()

    def unwatch(self) -> None:
        self.closing = True
        if self._previous_handler is not None:
            signal.signal(FAILURE_SIGNAL, self._previous_handler)
            self._previous_handler = None

    def _raise_failure(self, signum: int, frame: Any) -> None:
        if self.reason is not None and not self.closing and not self.delivered:
            self.delivered = True
            raise RankFailure(self.reason)

    def _watch(self, timeout_s: float, steps_sent: Callable[[], int]) -> None:
        sentinels = {p.sentinel: rank for rank, p in self.procs.items()}
        while not self.closing:
            # wait() returns those of the sentinels given (ints) that are ready: the dead workers'
            died = [sentinels[s] for s in wait_for_sentinels(list(sentinels), timeout=0.5) if isinstance(s, int)]
            if self.closing:
                return
            if died:
                self._fail(self._death(died[0]))
            began = self.step_began
            if began is not None and time.monotonic() - began > timeout_s:
                late = [r for r in self.procs if self.acks[r] < steps_sent()]
                who = (", ".join(f"rank {r} (pid {self.procs[r].pid})" for r in late)
                       or "rank 0 or a rank on another node")
                self._fail(f"tensor-parallel {who} did not answer within {timeout_s:g} s "
                           f"(raise {STEP_TIMEOUT_ENV} if steps are legitimately slower)")

    def _death(self, rank: int) -> str:
        proc = self.procs[rank]
        proc.join(1.0)
        return f"tensor-parallel rank {rank} (pid {proc.pid}) died: {describe_exit(proc.exitcode)}"

    def failure_reason(self, wait_s: float) -> str | None:
        """The watchdog's verdict, or a dead worker seen within wait_s; None if all seem well."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.reason is not None:
                return self.reason
            for rank, proc in self.procs.items():
                if not proc.is_alive():
                    return self._death(rank)
            time.sleep(0.05)
        return self.reason

    def _fail(self, reason: str) -> None:
        """No rank can go on without the others: say why, end the workers, end the engine.

        The engine's own thread is interrupted first so that it fails the ordinary way (its
        owner reports the reason, e.g. the API's 503 bodies and /health); a thread stuck in a
        collective cannot take the signal, so after a grace period the process ends here."""
        self.reason = reason
        log.error("%s", reason)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
        if self.step_thread is not None and self.step_thread is not threading.main_thread():
            # The engine steps on a thread of a process that is not ours to end (the in-process
            # benchmark): with its peers gone its next collective fails (bounded by the collective
            # timeout) and its owner reports the reason and keeps what it measured.
            return
        if self._previous_handler is not None:
            main_ident = threading.main_thread().ident
            assert main_ident is not None
            signal.pthread_kill(main_ident, FAILURE_SIGNAL)
            time.sleep(FAILURE_GRACE_S)
        os._exit(1)

    def join_all(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
