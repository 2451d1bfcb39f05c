"""Tensor parallelism over torch.distributed: the rank's group, the collectives the sharded model
calls, the per-step broadcast from the engine core, and the lives of the worker ranks.

One process per rank. The engine core is rank 0: it runs the scheduler and the sampler, and its
ModelRunner starts the other ranks of its node ('spawn' processes running `_worker_main`). Every
step, rank 0 broadcasts the batch inputs (a fixed header of shapes, then one int64 payload) over
a gloo group; every rank runs the forward pass on its shard, joining the all-reduces inside the
model; rank 0 alone receives the full logits. Collectives of the forward pass go over NCCL on
GPUs and gloo on CPU.

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

Failure: rank 0 watches its worker processes. A worker that exits, or a step that has not
finished within AGENTLOAD_TP_STEP_TIMEOUT_S (default 120 s), makes rank 0 print which rank and
why, stop the others, raise RankFailure in the engine's thread (so the engine process reports
the reason and exits 1, which the API side turns into 503s, a failing /health and a non-zero
exit), and, if that thread is stuck in a collective, exit 1 itself after a few seconds.

Other nodes (--nnodes > 1) run `python -m server.parallel` with the same engine flags and their
--node-rank; it starts that node's ranks, or, under `torchrun --standalone --nproc-per-node M`
(or any launcher that starts one process per local rank and sets LOCAL_RANK), runs one rank per
process: global rank = node_rank * M + LOCAL_RANK.
"""

from __future__ import annotations

import argparse
import datetime
import math
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_for_sentinels

import torch
import torch.distributed as dist

from server.config import EngineConfig, resolve_device

# NVLink multicast (NVLS) hangs or fails on the lent H200 hosts; every rank keeps it off.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
STEP_TIMEOUT_ENV = "AGENTLOAD_TP_STEP_TIMEOUT_S"
DEFAULT_STEP_TIMEOUT_S = 120.0
# Workers wait for the next step inside a broadcast while the server idles, for any length of time.
IDLE_TIMEOUT = datetime.timedelta(days=365)
# The watchdog interrupts the engine's thread with this signal to raise RankFailure there.
FAILURE_SIGNAL = signal.SIGUSR1
FAILURE_GRACE_S = 5.0
MAX_STEP_TENSORS = 8
_HEADER_LEN = 1 + 2 * MAX_STEP_TENSORS
_STOP = -1


def disable_multicast() -> None:
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)


def step_timeout_s() -> float:
    raw = os.environ.get(STEP_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_STEP_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{STEP_TIMEOUT_ENV}: must be a positive number of seconds, got {raw!r}")
    return value


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class TensorParallel:
    """This rank's place in the group, and the collectives the sharded model calls (identity at
    world size 1, so a single-GPU engine runs exactly the unsharded code)."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.group: dist.ProcessGroup | None = None  # the forward pass's collectives
        self.meta_group: dist.ProcessGroup | None = None  # gloo: step broadcast, start-up agreement
        self._workers: WorkerSet | None = None
        self._finalizer: multiprocessing.util.Finalize | None = None
        self._threads_before: int | None = None
        self._steps = 0

    # ---- the model's collectives ---------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: every rank's x concatenated along the last dim; other ranks: None."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's value (each rank sizes its KV pool from its own memory)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.meta_group)
        return int(t.item())

    # ---- joining the group ---------------------------------------------------------------
    def connect(self, config: EngineConfig, addr: str, port: int, timeout_s: float) -> None:
        """Rendezvous at addr:port (rank 0 hosts the store) and build both process groups."""
        device = resolve_device(config.device)
        store = dist.TCPStore(addr, port, self.world_size, is_master=self.rank == 0,
                              timeout=datetime.timedelta(seconds=timeout_s))
        if device == "cuda":
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=store, rank=self.rank,
                                world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s))
        self.group = dist.group.WORLD
        self.meta_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)

    def start_workers(self, config: EngineConfig) -> None:
        """Rank 0: start this node's other ranks, then join the group with them."""
        p = config.parallel
        if p.node_rank != 0:
            raise ValueError(f"--node-rank {p.node_rank}: `server start` is rank 0 and runs on node 0; "
                             "start the other nodes with `python -m server.parallel`")
        disable_multicast()
        timeout = step_timeout_s()
        if p.nnodes == 1:
            addr, port = "127.0.0.1", _free_port()
        else:
            addr, port = p.master_addr, p.master_port
        per_node = self.world_size // p.nnodes
        if resolve_device(config.device) == "cpu":
            # CPU ranks of one node share its cores: oversubscribed OpenMP threads stall each step.
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(max(1, self._threads_before // per_node))
        self._workers = WorkerSet.spawn(config, range(1, per_node), addr, port)
        self._workers.watch(timeout, lambda: self._steps)
        # Runs before multiprocessing's exit hook terminates daemon children, so that the
        # watchdog does not take a clean shutdown for a dead rank.
        self._finalizer = multiprocessing.util.Finalize(self, self._stop, exitpriority=10)
        # The collectives' own timeout is the backstop for ranks on other nodes; the watchdog,
        # which can name the rank, fires first for this node's.
        self.connect(config, addr, port, 2 * timeout)

    def stop(self) -> None:
        """Rank 0: tell the workers to exit, wait for them (kill stragglers), leave the group. Once."""
        if self._finalizer is not None:
            self._finalizer()

    def _stop(self) -> None:
        if self._workers is not None:
            self._workers.unwatch()
            try:
                self.send_step(None)
            except Exception:  # noqa: BLE001 - a dead peer: the joins below still end every worker
                pass
            self._workers.join_all()
            self._workers = None
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.group = self.meta_group = None

    # ---- the step broadcast --------------------------------------------------------------
    def send_step(self, tensors: list[torch.Tensor] | None) -> None:
        """Rank 0: broadcast one step's host inputs (int64, at most 2-D), or None to stop."""
        header = torch.full((_HEADER_LEN,), -1, dtype=torch.int64)
        if tensors is None:
            header[0] = _STOP
            dist.broadcast(header, src=0, group=self.meta_group)
            return
        header[0] = len(tensors)
        for i, t in enumerate(tensors):
            header[1 + 2 * i:1 + 2 * i + t.dim()] = torch.tensor(t.shape)
        dist.broadcast(header, src=0, group=self.meta_group)
        dist.broadcast(torch.cat([t.reshape(-1) for t in tensors]), src=0, group=self.meta_group)

    def receive_step(self) -> list[torch.Tensor] | None:
        """Worker ranks: the next step's inputs as rank 0 sent them, or None when told to stop."""
        header = torch.empty(_HEADER_LEN, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.meta_group)
        count = int(header[0])
        if count == _STOP:
            return None
        shapes = [tuple(d for d in header[1 + 2 * i:3 + 2 * i].tolist() if d >= 0) for i in range(count)]
        sizes = [math.prod(s) for s in shapes]
        payload = torch.empty(sum(sizes), dtype=torch.int64)
        dist.broadcast(payload, src=0, group=self.meta_group)
        return [part.view(shape) for part, shape in zip(payload.split(sizes), shapes)]

    def step_started(self) -> None:
        self._steps += 1
        if self._workers is not None:
            self._workers.step_began = time.monotonic()
            self._workers.step_thread = threading.current_thread()

    def step_finished(self) -> None:
        if self._workers is not None:
            self._workers.step_began = None
        elif self.rank > 0 and _ACKS is not None:
            _ACKS[self.rank] = self._steps

    def failure(self, exc: BaseException) -> BaseException:
        """Rank 0, after a step raised: RankFailure with the plain reason when a rank died or
        hung, else exc itself."""
        if isinstance(exc, RankFailure) or self._workers is None:
            return exc
        reason = self._workers.failure_reason(wait_s=2.0)
        if reason is None:
            return exc
        self._workers.delivered = True
        return RankFailure(reason)


class RankFailure(RuntimeError):
    """A tensor-parallel rank died or hung: no rank can go on without the others."""


class WorkerSet:
    """Rank 0's handle on the worker processes of its node, and the watchdog thread over them."""

    def __init__(self, procs: dict[int, multiprocessing.process.BaseProcess], acks) -> None:
        self.procs = procs
        self.acks = acks  # shared int64 per rank: the last step each worker finished
        self.closing = False
        self.step_began: float | None = None
        self.reason: str | None = None
        self.delivered = False  # the engine's thread has its RankFailure: interrupt it no more
        self._previous_handler = None  # SIGUSR1's handler before ours, when we installed one
        self.step_thread: threading.Thread | None = None  # the thread that runs the engine's steps

    @classmethod
    def spawn(cls, config: EngineConfig, ranks: range, addr: str, port: int) -> WorkerSet:
        ctx = multiprocessing.get_context("spawn")
        acks = ctx.Array("q", config.parallel.tensor_parallel_size, lock=False)
        procs = {}
        for rank in ranks:
            proc = ctx.Process(target=_worker_main, name=f"agentload-tp-rank{rank}", daemon=True,
                               args=(config, rank, rank, addr, port, torch.get_num_threads(), os.getpid(), acks))
            proc.start()
            print(f"engine: tensor-parallel rank {rank} started (pid {proc.pid})", file=sys.stderr, flush=True)
            procs[rank] = proc
        return cls(procs, acks)

    def watch(self, timeout_s: float, steps_sent) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(FAILURE_SIGNAL, self._raise_failure)
        threading.Thread(target=self._watch, args=(timeout_s, steps_sent), name="tp-watchdog",
                         daemon=True).start()

    def unwatch(self) -> None:
        self.closing = True
        if self._previous_handler is not None:
            signal.signal(FAILURE_SIGNAL, self._previous_handler)
            self._previous_handler = None

    def _raise_failure(self, signum: int, frame) -> None:
        if self.reason is not None and not self.closing and not self.delivered:
            self.delivered = True
            raise RankFailure(self.reason)

    def _watch(self, timeout_s: float, steps_sent) -> None:
        sentinels = {p.sentinel: rank for rank, p in self.procs.items()}
        while not self.closing:
            ready = wait_for_sentinels(list(sentinels), timeout=0.5)
            if self.closing:
                return
            if ready:
                self._fail(self._death(sentinels[ready[0]]))
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
        print(f"engine: error: {reason}", file=sys.stderr, flush=True)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
        if self.step_thread is not None and self.step_thread is not threading.main_thread():
            # The engine steps on a thread of a process that is not ours to end (the in-process
            # benchmark): with its peers gone its next collective fails (bounded by the collective
            # timeout) and its owner reports the reason and keeps what it measured.
            return
        if self._previous_handler is not None:
            signal.pthread_kill(threading.main_thread().ident, FAILURE_SIGNAL)
            time.sleep(FAILURE_GRACE_S)
        os._exit(1)

    def join_all(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


_ACKS = None  # a worker's view of rank 0's shared step counters


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_with_parent(parent_pid: int) -> None:
    """A spawned worker whose engine process vanished (SIGKILL) must not linger in a collective."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def _worker_main(config: EngineConfig, rank: int, local_rank: int, addr: str, port: int,
                 num_threads: int, parent_pid: int | None, acks=None) -> None:
    """A worker rank: join the group, build this rank's shard, run steps until told to stop."""
    global _ACKS
    _ACKS = acks
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
        tp.connect(config, addr, port, 2 * step_timeout_s())
        ModelRunner(config, tp).serve()
        dist.destroy_process_group()
    except BaseException:
        print(f"engine: tensor-parallel rank {rank}: error:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    """`python -m server.parallel`: the ranks of one node other than node 0."""
    from server.args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser(
        prog="python -m server.parallel",
        description="Run the tensor-parallel ranks of one node (--node-rank >= 1) of a `server start "
                    "--nnodes N` engine; give the same engine flags as the server. Starts the node's "
                    "--tp/--nnodes ranks itself, or, under a launcher that starts one process per "
                    "local rank and sets LOCAL_RANK (torchrun --standalone --nproc-per-node M), "
                    "runs rank --node-rank * M + LOCAL_RANK in this process.")
    add_engine_args(parser)
    try:
        config = engine_config_from_args(parser.parse_args(argv))
        p = config.parallel
        if p.nnodes < 2 or p.node_rank < 1:
            raise ValueError("--nnodes must be at least 2 and --node-rank at least 1 (node 0 runs `server start`)")
        per_node = p.tensor_parallel_size // p.nnodes
        local_rank = os.environ.get("LOCAL_RANK")
        if local_rank is not None and not (local_rank.isdigit() and int(local_rank) < per_node):
            raise ValueError(f"LOCAL_RANK={local_rank!r}: must be in 0..{per_node - 1} (--tp / --nnodes ranks per node)")
    except ValueError as exc:
        print(f"server.parallel: error: {exc}", file=sys.stderr)
        return 2
    disable_multicast()
    first = p.node_rank * per_node
    if local_rank is not None:
        _worker_main(config, first + int(local_rank), int(local_rank), p.master_addr, p.master_port,
                     torch.get_num_threads(), None)
        return 0
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker_main, args=(config, first + i, i, p.master_addr, p.master_port,
                                                    max(1, torch.get_num_threads() // per_node), None))
             for i in range(per_node)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return int(any(proc.exitcode != 0 for proc in procs))


if __name__ == "__main__":
    sys.exit(main())
