"""The rollout side's control loop: coroutines run on its own thread for callers elsewhere, errors
come back to the caller, close runs a finaliser once; the switch interval is lowered only inside
:func:`prompt_thread_switches`."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from areal_tasks.errors import RolloutError
from areal_tasks.rollout.control_loop import ControlLoop, prompt_thread_switches


def test_runs_coroutines_on_its_own_thread_and_returns_their_results_and_errors():
    control = ControlLoop("test-control")
    try:

        async def where(x: int) -> tuple[str, int]:
            await asyncio.sleep(0)
            return threading.current_thread().name, x * 2

        assert control.run(where, 21) == ("test-control", 42)

        async def fails() -> None:
            raise ValueError("the server refused")

        with pytest.raises(ValueError, match="the server refused"):
            control.run(fails)
    finally:
        control.close()


def test_close_runs_the_finaliser_once_then_refuses_work(caplog):
    control = ControlLoop("test-control")
    closed: list[str] = []

    async def finalizer() -> None:
        closed.append(threading.current_thread().name)

    control.close(finalizer)
    control.close(finalizer)
    assert closed == ["test-control"]

    async def nothing() -> None:
        return None

    with pytest.raises(RolloutError, match="test-control is closed"):
        control.run(nothing)

    other = ControlLoop("failing-close")

    async def broken() -> None:
        raise RuntimeError("connections already gone")

    other.close(broken)  # logged, and the loop still stops
    assert "closing its connections failed" in caplog.text


def test_close_cancels_a_call_still_running_and_its_caller_gets_a_clear_error():
    control = ControlLoop("test-control")
    started = threading.Event()
    errors: list[BaseException] = []

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    def call() -> None:
        try:
            control.run(forever)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert started.wait(10)
    control.close()
    caller.join(10)
    assert len(errors) == 1 and isinstance(errors[0], RolloutError)
    assert "test-control was closed while this call ran" in str(errors[0])


def test_thread_switch_interval_is_lowered_only_inside_and_nests():
    before = sys.getswitchinterval()
    with prompt_thread_switches(0.0002):
        assert sys.getswitchinterval() == pytest.approx(min(before, 0.0002))
        with prompt_thread_switches(0.0002):
            pass
        assert sys.getswitchinterval() == pytest.approx(min(before, 0.0002))  # the inner one did not restore
    assert sys.getswitchinterval() == before
    with pytest.raises(KeyError), prompt_thread_switches():
        raise KeyError("boom")
    assert sys.getswitchinterval() == before
