"""Async saves: one in flight (a second waits), failures surface, the staged copy is independent of
training, and the manager's async checkpoints hold the state of the moment save() was called."""

from __future__ import annotations

import threading

import pytest
import torch

from areal_tasks.checkpoint.async_save import AsyncSaver, stage_state_dict, state_nbytes
from areal_tasks.checkpoint.state import TrainerState

WAIT_S = 30.0  # guards against a hang only; never part of an assertion about speed


def test_one_job_in_flight_and_a_second_submit_waits():
    saver = AsyncSaver()
    release = threading.Event()
    started = threading.Event()
    events: list[str] = []
    running = []

    def job(name: str, gate: threading.Event | None):
        def run() -> str:
            running.append(name)
            assert len(running) == 1, f"two saves in flight: {running}"
            events.append(f"start {name}")
            if gate is not None:
                started.set()
                assert gate.wait(WAIT_S)
            events.append(f"end {name}")
            running.remove(name)
            return name

        return run

    first = saver.submit(job("a", release))
    assert started.wait(WAIT_S) and saver.in_flight
    second_done = threading.Event()

    def second() -> None:
        saver.submit(job("b", None), before=lambda: events.append("stage b"))
        second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    while saver.waiting == 0:  # the second submit is blocked behind the first job
        assert thread.is_alive()
        threading.Event().wait(0.01)
    assert not second_done.is_set() and events == ["start a"]
    release.set()
    thread.join(WAIT_S)
    assert first.result() == "a" and saver.wait() == "b"
    assert events == ["start a", "end a", "stage b", "start b", "end b"]
    saver.close()


def test_a_failed_job_is_raised_at_the_next_submit():
    saver = AsyncSaver()

    def boom() -> None:
        raise OSError("disk full")

    saver.submit(boom)
    with pytest.raises(OSError, match="disk full"):
        saver.submit(lambda: None)
    saver.close()


def test_staged_copy_is_independent():
    live = {"w": torch.ones(4), "opt": {"step": torch.tensor(1.0), "lr": [0.1]}}
    staged = stage_state_dict(live)
    live["w"].add_(1)
    live["opt"]["step"].add_(1)
    live["opt"]["lr"][0] = 0.2
    assert (
        torch.equal(staged["w"], torch.ones(4)) and float(staged["opt"]["step"]) == 1.0 and staged["opt"]["lr"] == [0.1]
    )
    assert state_nbytes(staged) == 4 * 4 + 4


def test_manager_async_checkpoint_holds_the_state_at_save_time(file_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(file_url, async_save=True, keep_last=5)
    engine.train_step()
    at_save = engine.params()
    ticket = manager.save(1, {"actor": engine}, TrainerState(step=1), {"loss": 1.0})
    engine.train_step()  # training goes on while the save may still be running
    engine.train_step()
    second = manager.save(3, {"actor": engine}, TrainerState(step=3), {})  # waits for the first
    assert ticket.done() and ticket.wait().step == 1
    assert second.wait().parent == 1
    fresh = toy_engine(seed=5)
    manager.load(1, {"actor": fresh})
    assert all(torch.equal(v, at_save[k]) for k, v in fresh.params().items())
    manager.close()
