"""``run_while_connected`` (``disconnect.py``): the work's answer, or its cancellation once the client left."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from areal_tasks.inference.server.disconnect import run_while_connected


class Client:
    """An ASGI ``receive`` whose client leaves when :meth:`leave` is called (or never)."""

    def __init__(self, fail: bool = False) -> None:
        self.gone = asyncio.Event()
        self.fail = fail

    async def receive(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("the transport broke")
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()


def test_work_that_finishes_answers_and_leaves_no_cancellation_behind() -> None:
    async def main() -> tuple[tuple[bool, Any], int]:
        client = Client()
        result = await run_while_connected(client.receive, asyncio.sleep(0.01, result="done"))
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0.01)  # the watcher is gone: a later leave cancels nothing
        client.leave()
        await asyncio.sleep(0.01)
        return result, task.cancelling()

    assert asyncio.run(main()) == ((True, "done"), 0)


def test_a_client_that_leaves_cancels_the_work_and_the_caller_goes_on() -> None:
    cancelled: list[bool] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)  # its cleanup runs before the caller is answered
            raise
        return "never"

    async def main() -> tuple[tuple[bool, Any], int, str]:
        client = Client()
        asyncio.get_running_loop().call_later(0.02, client.leave)
        result = await run_while_connected(client.receive, work())
        task = asyncio.current_task()
        assert task is not None
        after = await asyncio.sleep(0.01, result="still running")  # not cancelled by a leftover request
        return result, task.cancelling(), after

    assert asyncio.run(main()) == ((False, None), 0, "still running")
    assert cancelled == [True]


def test_a_cancellation_from_outside_propagates_even_when_the_client_left_too() -> None:
    async def handler(client: Client) -> tuple[bool, Any]:
        return await run_while_connected(client.receive, asyncio.sleep(30))

    async def main(leave_too: bool) -> None:
        client = Client()
        task = asyncio.ensure_future(handler(client))
        await asyncio.sleep(0.01)
        task.cancel()  # a server stopping
        if leave_too:
            client.leave()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main(False))
    asyncio.run(main(True))


def test_the_works_error_propagates() -> None:
    async def work() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad request")

    async def main() -> None:
        await run_while_connected(Client().receive, work())

    with pytest.raises(ValueError, match="bad request"):
        asyncio.run(main())


def test_a_receive_that_fails_lets_the_work_finish() -> None:
    async def main() -> tuple[bool, Any]:
        return await run_while_connected(Client(fail=True).receive, asyncio.sleep(0.01, result=7))

    assert asyncio.run(main()) == (True, 7)
