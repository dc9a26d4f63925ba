"""The server's thread lanes: deadlines, refusal instead of queueing, overdue calls, separation."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from areal_tasks.inference.server.executors import LaneBusyError, Lanes, LaneTimeoutError


def test_a_call_runs_off_the_loop_and_returns_its_value() -> None:
    lanes = Lanes({"tokenize": 1})
    loop_thread = threading.get_ident()

    async def main() -> int:
        return await lanes.run("tokenize", threading.get_ident, timeout_s=5)

    assert asyncio.run(main()) != loop_thread
    lanes.shutdown()


def test_a_call_past_its_deadline_raises_and_is_reported_overdue_until_it_returns() -> None:
    lanes = Lanes({"groups": 1})
    release = threading.Event()

    async def main() -> None:
        with pytest.raises(LaneTimeoutError, match="rendezvous did not finish within 0.1 s"):
            await lanes.run("groups", release.wait, 30, timeout_s=0.1, what="rendezvous")
        await asyncio.sleep(1.1)
        assert lanes.busy("groups")
        assert lanes.overdue() and lanes.overdue()[0].startswith("groups: rendezvous (")
        with pytest.raises(LaneBusyError, match="groups lane is busy"):
            await lanes.run("groups", lambda: None, timeout_s=1, refuse_when_busy=True)
        release.set()
        for _ in range(100):
            if not lanes.busy("groups"):
                break
            await asyncio.sleep(0.01)
        assert not lanes.busy("groups") and lanes.overdue() == []

    asyncio.run(main())
    lanes.shutdown()


def test_a_stuck_lane_does_not_hold_up_another() -> None:
    lanes = Lanes({"groups": 1, "weights": 1})
    release = threading.Event()

    async def main() -> str:
        stuck = asyncio.ensure_future(lanes.run("groups", release.wait, 30, timeout_s=30))
        await asyncio.sleep(0.05)
        try:
            return await lanes.run("weights", lambda: "loaded", timeout_s=5)
        finally:
            release.set()
            await stuck

    assert asyncio.run(main()) == "loaded"
    lanes.shutdown()


def test_unknown_lanes_and_calls_after_shutdown_are_refused() -> None:
    lanes = Lanes({"tokenize": 1})

    async def call(lane: str) -> None:
        await lanes.run(lane, lambda: None, timeout_s=1)

    with pytest.raises(Exception, match="unknown lane 'nope'; lanes: tokenize"):
        asyncio.run(call("nope"))
    lanes.shutdown()
    with pytest.raises(Exception, match="shutting down"):
        asyncio.run(call("tokenize"))


def test_a_queued_call_gets_its_whole_time_limit_from_its_start() -> None:
    """Time spent waiting behind another call does not count against a call's own work: with a
    0.5 s limit, a call queued 0.35 s behind another and then running 0.3 s returns its value
    (counted together, 0.65 s would have passed the limit)."""
    lanes = Lanes({"tokenize": 1})

    async def main() -> list[str]:
        def work(seconds: float, value: str) -> str:
            time.sleep(seconds)
            return value

        first = lanes.run("tokenize", work, 0.35, "first", timeout_s=0.5, wait_s=0.5)
        second = lanes.run("tokenize", work, 0.3, "second", timeout_s=0.5, wait_s=0.5)
        return list(await asyncio.gather(first, second))

    assert asyncio.run(main()) == ["first", "second"]
    lanes.shutdown()


def test_a_call_that_waits_past_wait_s_is_dropped_unrun_and_one_running_too_long_times_out() -> None:
    lanes = Lanes({"tokenize": 1})
    release = threading.Event()
    ran: list[str] = []

    async def main() -> None:
        stuck = asyncio.ensure_future(lanes.run("tokenize", release.wait, 30, timeout_s=0.3, wait_s=1, what="slow"))
        await asyncio.sleep(0.05)  # the slow call holds the only thread
        with pytest.raises(LaneBusyError, match="queued waited 0.2 s for a tokenize thread"):
            await lanes.run("tokenize", ran.append, "queued", timeout_s=5, wait_s=0.2, what="queued")
        with pytest.raises(LaneTimeoutError, match="slow did not finish within 0.3 s"):
            await stuck
        assert lanes.overdue() and lanes.overdue()[0].startswith("tokenize: slow (")  # the dropped one is not
        release.set()
        for _ in range(200):
            if not lanes.busy("tokenize"):
                break
            await asyncio.sleep(0.01)
        assert not lanes.busy("tokenize") and lanes.overdue() == []
        assert await lanes.run("tokenize", lambda: "next", timeout_s=1, wait_s=1) == "next"

    asyncio.run(main())
    assert ran == []  # the dropped call never ran, even once the thread was free
    lanes.shutdown()


def test_a_call_whose_caller_is_cancelled_while_queued_never_runs() -> None:
    lanes = Lanes({"tokenize": 1})
    release = threading.Event()
    ran: list[str] = []

    async def main() -> None:
        holder = asyncio.ensure_future(lanes.run("tokenize", release.wait, 30, timeout_s=5, wait_s=5))
        queued = asyncio.ensure_future(lanes.run("tokenize", ran.append, "queued", timeout_s=5, wait_s=5))
        await asyncio.sleep(0.1)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        assert await holder is True
        assert await lanes.run("tokenize", lambda: "after", timeout_s=1, wait_s=1) == "after"

    asyncio.run(main())
    assert ran == []
    lanes.shutdown()
