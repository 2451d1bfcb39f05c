"""Worker actors on a Ray cluster (`loadgen replay --ray auto|ADDRESS`; `pip install agentload[ray]`).

Each actor holds one `workers.Worker` (its own event loop, HTTP connections, share of the
lanes or arrivals) and is spread over the cluster's nodes; the parent merges the shares as
it merges local worker processes' (workers.RemotePool). Actors need loadgen and traces
importable on every node (install agentload there). Hosts are assumed NTP-synchronised: the
workers meet at a wall-clock start time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray

from loadgen.run.workers import RemotePool, Worker, WorkerError, WorkerSetup


class _WorkerActor:
    """Async actor: its calls run on the actor's event loop, so `snapshot` answers while
    `run_level` runs."""

    def __init__(self, setup: WorkerSetup) -> None:
        self.worker = Worker(setup)

    async def call(self, method: str, *args: Any) -> Any:
        result = getattr(self.worker, method)(*args)
        if hasattr(result, "__await__"):
            result = await result
        return result


class RayPool(RemotePool):
    def __init__(self, address: str, setups: list[WorkerSetup], on_records: Callable[[bytes], None] | None) -> None:
        super().__init__(len(setups), on_records)
        self._address = address
        self._setups = setups
        self._actors: list[Any] = []
        self._started_ray = False

    async def start(self) -> None:
        if not ray.is_initialized():
            self._join_cluster()
            self._started_ray = True
        actor = ray.remote(_WorkerActor).options(num_cpus=1, max_concurrency=64, scheduling_strategy="SPREAD")
        self._actors = [actor.remote(setup) for setup in self._setups]
        await self._all("open")

    def _join_cluster(self) -> None:
        try:
            try:
                ray.init(address=self._address, log_to_driver=False, logging_level=logging.ERROR)
            except ConnectionError:
                if self._address != "auto":
                    raise
                ray.init(log_to_driver=False, logging_level=logging.ERROR)  # no cluster running: a local one
        except Exception as exc:  # Ray raises a mix of ConnectionError, RuntimeError, ValueError
            raise WorkerError(f"cannot join the Ray cluster at {self._address}: {exc}") from exc

    async def _call(self, worker: int, method: str, *args: Any) -> Any:
        try:
            return await self._actors[worker].call.remote(method, *args)
        except ray.exceptions.RayError as exc:
            raise WorkerError(f"Ray worker {worker}: {exc}") from exc

    async def close(self) -> None:
        for number in range(len(self._actors)):
            try:
                await self._call(number, "close")
            except WorkerError:
                pass
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        if self._started_ray:
            ray.shutdown()
