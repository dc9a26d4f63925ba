"""The server's thread lanes: deadlines, refusal instead of queueing, overdue calls, separation."""

from __future__ import annotations

import asyncio
import threading

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
