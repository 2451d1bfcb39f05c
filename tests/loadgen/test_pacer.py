"""The request pacer: at most `per_turn` waiters go on per event-loop turn; cancelled ones take no slot."""

from __future__ import annotations

import asyncio

from loadgen.pacer import Pacer


def test_waiters_go_on_a_few_per_loop_turn():
    async def main() -> list[int]:
        pacer = Pacer(per_turn=3)
        turn = 0
        released: list[int] = []

        async def count_turns() -> None:
            nonlocal turn
            while True:
                await asyncio.sleep(0)
                turn += 1

        async def waiter() -> None:
            await pacer.turn()
            released.append(turn)

        counter = asyncio.ensure_future(count_turns())
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
        turn = 0
        went: list[int] = []
        at_once: list[bool] = []

        async def count_turns() -> None:
            nonlocal turn
            while True:
                await asyncio.sleep(0)
                turn += 1

        async def request(number: int) -> None:
            taken = pacer.take()
            if not taken:
                await pacer.turn()
            went.append(number)
            at_once.append(taken)

        counter = asyncio.ensure_future(count_turns())
        await asyncio.sleep(0)
        requests = [asyncio.ensure_future(request(n)) for n in range(10)]
        turns = []
        for task in requests:
            task.add_done_callback(lambda _: turns.append(turn))
        await asyncio.gather(*requests)
        counter.cancel()
        assert went == list(range(10))  # first come, first served
        return turns, at_once

    turns, at_once = asyncio.run(main())
    assert at_once == [True] * 3 + [False] * 7
    per_turn = {t: turns.count(t) for t in set(turns)}
    assert max(per_turn.values()) <= 3 and len(per_turn) >= 4
