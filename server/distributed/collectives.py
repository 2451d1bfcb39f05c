"""A rank's place in the tensor-parallel group: the collectives the sharded model calls, and the
per-step broadcast of the batch inputs from the engine core (rank 0) to the other ranks.

At world size 1 every collective is the identity, so a single-GPU engine runs exactly the
unsharded code. Rank 0 hands the lives of its node's worker ranks to server/distributed/supervisor.py.
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from server.config import EngineConfig, resolve_device
from server.distributed.settings import collective_timeout_s

if TYPE_CHECKING:
    from server.distributed.supervisor import Supervisor
    from server.distributed.worker import RankServer

# Workers wait for the next step inside a broadcast while the server idles, for any length of time.
IDLE_TIMEOUT = datetime.timedelta(days=365)
MAX_STEP_TENSORS = 8
_HEADER_LEN = 1 + 2 * MAX_STEP_TENSORS
_STOP = -1


class TensorParallel:
    """This rank's place in the group, and the collectives the sharded model calls."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.group: dist.ProcessGroup | None = None  # the forward pass's collectives
        self.meta_group: dist.ProcessGroup | None = None  # gloo: step broadcast, start-up agreement
        self.acks: Any = None  # a worker's view of rank 0's shared step counters
        self.steps = 0
        self._supervisor: Supervisor | None = None  # rank 0, world size > 1

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

    # ---- joining and leaving the group ---------------------------------------------------
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

    def disconnect(self) -> None:
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.group = self.meta_group = None

    def start_workers(self, config: EngineConfig, serve: RankServer) -> None:
        """Rank 0: start this node's other ranks, each running `serve`, then join the group with them."""
        from server.distributed.supervisor import Supervisor

        self._supervisor = supervisor = Supervisor.start(self, config, serve)
        # The collectives' own timeout is the backstop for ranks on other nodes; the watchdog,
        # which can name the rank, fires first for this node's.
        self.connect(config, *supervisor.rendezvous, collective_timeout_s(supervisor.timeout_s))

    def stop(self) -> None:
        """Rank 0: end the workers and leave the group. Once."""
        if self._supervisor is not None:
            self._supervisor.stop()

    def failure(self, exc: BaseException) -> BaseException:
        """Rank 0, after a step raised: RankFailure with the plain reason when a rank died or
        hung, else exc itself."""
        return exc if self._supervisor is None else self._supervisor.failure(exc)

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
        self.steps += 1
        if self._supervisor is not None:
            self._supervisor.step_started()

    def step_finished(self) -> None:
        if self._supervisor is not None:
            self._supervisor.step_finished()
        elif self.rank > 0 and self.acks is not None:
            self.acks[self.rank] = self.steps
