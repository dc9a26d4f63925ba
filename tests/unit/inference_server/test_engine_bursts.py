"""An idle engine lets a burst of requests settle before it admits them (``engine.py``, "Bursts"):
requests that arrive one by one, each within the quiet window of the last, are prefilled in one
admission; a control call is not held up by the wait; the wait is off with ``burst_quiet_s=0``
and bounded; a busy engine does not wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from server_helpers import Submitted, make_request

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server import engine as engine_module
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner

PROMPTS = [[5, 17, 33, 2], [9, 9, 100, 41], [300, 7], [12, 55, 81], [250, 1, 8]]


@pytest.fixture
def admissions(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, list[int]]]:
    """An engine whose quiet window (0.3 s, bound 10 s) is wide enough that a test thread's
    arrivals 20 ms apart always fall inside it, and the sizes of its admissions in order."""
    monkeypatch.setattr(engine_module, "BURST_MAX_WAIT_S", 10.0)
    engine = Engine(runner, burst_quiet_s=0.3)
    sizes: list[int] = []
    admit = engine.prefiller.admit

    def recorded(seqs):
        sizes.append(len(seqs))
        return admit(seqs)

    engine.prefiller.admit = recorded  # type: ignore[method-assign]
    engine.start()
    yield engine, sizes
    engine.shutdown()


def _arrive(engine: Engine, requests: list[Submitted], gap_s: float) -> None:
    for req in requests:
        engine.submit(req.seqs)
        time.sleep(gap_s)


def test_requests_arriving_one_by_one_are_admitted_together(admissions) -> None:
    engine, sizes = admissions
    requests = [make_request(p, rid=f"b{i}", temperature=0.0, max_new_tokens=3) for i, p in enumerate(PROMPTS)]
    _arrive(engine, requests, gap_s=0.02)
    for req in requests:
        assert len(req.wait()[0].output_ids) == 3
    assert sizes == [len(PROMPTS)]


def test_a_busy_engine_admits_arrivals_between_its_steps(admissions) -> None:
    engine, sizes = admissions
    long = make_request(PROMPTS[0], rid="long", temperature=0.0, max_new_tokens=400, ignore_eos=True)
    engine.submit(long.seqs)
    while not long.seqs[0].output_ids:  # decoding: the engine is busy from here on
        time.sleep(0.005)
    late = make_request(PROMPTS[1], rid="late", temperature=0.0, max_new_tokens=2)
    engine.submit(late.seqs)
    assert len(late.wait()[0].output_ids) == 2
    assert not long.seqs[0].finished  # admitted while the long one still decoded, not after it
    assert sizes == [1, 1]


def test_a_control_call_does_not_wait_for_the_burst(admissions) -> None:
    engine, _ = admissions
    first = make_request(PROMPTS[0], rid="c0", temperature=0.0, max_new_tokens=2)
    stop = threading.Event()

    def trickle() -> None:  # keeps the burst growing: without the control, the wait would last 10 s
        i = 0
        while not stop.is_set():
            engine.submit(make_request(PROMPTS[i % len(PROMPTS)], rid=f"t{i}", temperature=0.0, max_new_tokens=1).seqs)
            i += 1
            time.sleep(0.05)

    engine.submit(first.seqs)
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        assert engine.call(lambda: "ran").result(timeout=5) == "ran"
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        thread.join()
    assert len(first.wait()[0].output_ids) == 2


class _NoWaiting:
    """A condition whose ``wait`` fails the test: the engine must not wait."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond

    def __enter__(self):
        return self._cond.__enter__()

    def __exit__(self, *exc):
        return self._cond.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        raise AssertionError(f"the engine waited ({timeout} s)")


@pytest.mark.parametrize(("quiet_s", "waiting"), [(0.0, 1), (0.01, 8)], ids=["off", "queue-fills-the-free-slots"])
def test_no_wait_when_off_or_when_the_queue_fills_the_slots(runner: ModelRunner, quiet_s: float, waiting: int) -> None:
    engine = Engine(runner, burst_quiet_s=quiet_s)  # not started: _settle_burst runs here
    assert runner.cache.free_slots == 8
    for i in range(waiting):
        engine._waiting.extend(make_request(PROMPTS[i % len(PROMPTS)], rid=f"w{i}").seqs)
    engine._cond = _NoWaiting(engine._cond)  # type: ignore[assignment]
    engine._settle_burst()


def test_an_idle_engine_with_room_does_wait(runner: ModelRunner) -> None:
    engine = Engine(runner, burst_quiet_s=0.01)
    engine._waiting.extend(make_request(PROMPTS[0], rid="w").seqs)
    engine._cond = _NoWaiting(engine._cond)  # type: ignore[assignment]
    with pytest.raises(AssertionError, match="the engine waited"):
        engine._settle_burst()


@pytest.mark.parametrize("bad", [-0.001, engine_module.BURST_MAX_WAIT_S + 1])
def test_a_quiet_window_out_of_range_is_refused(runner: ModelRunner, bad: float) -> None:
    with pytest.raises(InferenceError, match="burst_quiet_s must be between 0 and"):
        Engine(runner, burst_quiet_s=bad)
