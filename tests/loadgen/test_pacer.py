"""The request pacer: at most `per_turn` waiters go on per event-loop turn; cancelled ones take no slot."""

from __future__ import annotations

import asyncio
import time

from loadgen.run.pacer import Pacer


class _Turns:
    """Counts event-loop turns while `run` runs (a task that yields once a turn)."""

    def __init__(self) -> None:
        self.count = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1


def test_waiters_go_on_a_few_per_loop_turn():
    async def main() -> list[int]:
        pacer = Pacer(per_turn=3)
        turns = _Turns()
        released: list[int] = []

        async def waiter() -> None:
            await pacer.turn()
            released.append(turns.count)

        counter = asyncio.ensure_future(turns.run())
        waiters = [asyncio.ensure_future(waiter()) for _ in range(10)]
        waiters[1].cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        counter.cancel()
        return released

    released = asyncio.run(main())
    assert len(released) == 9
    per_turn = {t: released.count(t) for t in set(released)}
    assert max(per_turn.values()) <= 3 and len(per_turn) >= 3  # spread over several turns
    assert released == sorted(released)  # first come, first served


def test_requests_with_room_in_their_turn_go_on_at_once_and_the_rest_wait():
    """`take` lets the first `per_turn` requests of a turn go on without waiting; the others wait
    their turns, first come, first served, still at most `per_turn` a turn."""
    async def main() -> tuple[list[int], list[bool]]:
        pacer = Pacer(per_turn=3)
        loop_turns = _Turns()
        went: list[int] = []
        at_once: list[bool] = []

        async def request(number: int) -> None:
            taken = pacer.take()
            if not taken:
                await pacer.turn()
            went.append(number)
            at_once.append(taken)

        counter = asyncio.ensure_future(loop_turns.run())
        await asyncio.sleep(0)
        requests = [asyncio.ensure_future(request(n)) for n in range(10)]
        turns = []
        for task in requests:
            task.add_done_callback(lambda _: turns.append(loop_turns.count))
        await asyncio.gather(*requests)
        counter.cancel()
        assert went == list(range(10))  # first come, first served
        return turns, at_once

    turns, at_once = asyncio.run(main())
    assert at_once == [True] * 3 + [False] * 7
    per_turn = {t: turns.count(t) for t in set(turns)}
    assert max(per_turn.values()) <= 3 and len(per_turn) >= 4


def test_costly_preparations_go_on_fewer_per_turn():
    """Waiters whose preparation takes a while (a full-length prompt's synthesis and encoding)
    go on fewer per turn, so the loop reads its sockets within the budget; cheap ones stay at the
    most per turn (against a budget that a busy test host's scheduling cannot spend)."""
    async def run(cost_s: float, budget_s: float) -> tuple[int, int]:
        pacer = Pacer(per_turn=8, budget_s=budget_s)
        turns = _Turns()
        released: list[int] = []

        async def waiter() -> None:
            await pacer.turn()
            released.append(turns.count)
            time.sleep(cost_s)  # the preparation: synchronous work before the request's first await

        counter = asyncio.ensure_future(turns.run())
        await asyncio.gather(*(waiter() for _ in range(40)))
        counter.cancel()
        late = released[len(released) // 2:]  # once the cost is measured
        return max(late.count(t) for t in set(late)), pacer.per_turn

    busiest, per_turn = asyncio.run(run(0.001, budget_s=0.002))
    assert per_turn <= 2 and busiest <= 2
    busiest, per_turn = asyncio.run(run(0.0, budget_s=0.05))
    assert per_turn == 8 and busiest == 8
