"""Batched hand-over of finished sequences to an event loop (``deliveries.py``)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from areal_tasks.inference.server.deliveries import LoopDeliveries


def test_a_burst_of_finishes_wakes_the_loop_once_and_resolves_every_future() -> None:
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        deliveries: LoopDeliveries[int] = LoopDeliveries(loop)
        futures = [loop.create_future() for _ in range(1000)]

        def engine_step() -> None:  # one decode step finishing every sequence, as the engine thread does
            for i, future in enumerate(futures):
                deliveries.deliver(future, i)

        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()  # the loop is blocked meanwhile: every finish lands before the first drain
        return list(await asyncio.gather(*futures)), deliveries.wakeups

    results, wakeups = asyncio.run(main())
    assert results == list(range(1000))
    assert wakeups == 1


def test_concurrent_producers_lose_no_finish() -> None:
    """Two threads delivering while the loop drains: every future resolves (no lost wake-up)."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        deliveries: LoopDeliveries[int] = LoopDeliveries(loop)
        futures = [loop.create_future() for _ in range(4000)]

        def produce(start: int) -> None:
            for i in range(start, len(futures), 2):
                deliveries.deliver(futures[i], i)

        threads = [threading.Thread(target=produce, args=(k,)) for k in (0, 1)]
        for thread in threads:
            thread.start()
        results = await asyncio.wait_for(asyncio.gather(*futures), timeout=30)
        for thread in threads:
            thread.join()
        return list(results)

    assert asyncio.run(main()) == list(range(4000))


def test_a_cancelled_future_is_left_alone_and_the_rest_resolve() -> None:
    async def main() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        deliveries: LoopDeliveries[int] = LoopDeliveries(loop)
        gone, kept = loop.create_future(), loop.create_future()
        gone.cancel()  # its client went away
        deliveries.deliver(gone, 1)
        deliveries.deliver(kept, 2)
        return gone.cancelled(), await kept

    assert asyncio.run(main()) == (True, 2)


def test_a_closed_loop_is_an_error_and_a_later_loop_is_not_stuck() -> None:
    loop = asyncio.new_event_loop()
    deliveries: LoopDeliveries[int] = LoopDeliveries(loop)
    future = loop.create_future()
    loop.close()
    with pytest.raises(RuntimeError):
        deliveries.deliver(future, 1)
    assert deliveries.wakeups == 1
    # the failed wake-up did not leave the flag set: the next finish asks for a wake-up again
    with pytest.raises(RuntimeError):
        deliveries.deliver(future, 2)
    assert deliveries.wakeups == 2
