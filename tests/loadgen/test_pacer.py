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
