"""The callback base: every hook the RL loop calls exists on ``Callback`` as a no-op (so a callback
overrides only what it needs), ``CallbackList`` calls each hook on every callback in order with
the same arguments, and the built-in loggers are callbacks."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from areal_tasks.trainer.callbacks import HOOKS, Callback, CallbackList, ConsoleProgress, JsonlMetrics

ARGS: dict[str, tuple[Any, ...]] = {
    "on_start": (3,),
    "on_step_metrics": (1, {"reward/mean": 0.5}),
    "on_step": (1, {"reward/mean": 0.5}),
    "on_step_end": (1, {"reward/mean": 0.5}),
    "on_eval": (1, {"eval/reward": 0.25}, "/models/step_1"),
    "on_checkpoint": (1, "file:///ckpt/step_1", {"step": 1}),
    "on_train_end": ({"steps": 1},),
    "on_end": ({"steps": 1},),
    "fail": ("RuntimeError: boom",),
}


class Recorder(Callback):
    def __init__(self, name: str, log: list[tuple[str, str, tuple[Any, ...]]]) -> None:
        self.name, self.log = name, log

    def __getattribute__(self, attr: str) -> Any:
        if attr in HOOKS:
            return lambda *args: self.log.append((self.name, attr, args))
        return super().__getattribute__(attr)


def test_the_hooks_are_every_public_method_of_callback() -> None:
    public = [n for n, m in vars(Callback).items() if inspect.isfunction(m) and not n.startswith("_")]
    assert list(HOOKS) == public == list(ARGS)
    assert set(HOOKS) <= {n for n in vars(CallbackList) if not n.startswith("_")}


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_a_no_op_on_the_base(hook: str) -> None:
    assert getattr(Callback(), hook)(*ARGS[hook]) is None


def test_a_callback_overrides_only_what_it_needs() -> None:
    class Steps(Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_step(self, step: int, metrics: Any) -> None:
            self.steps.append(step)

    cb = Steps()
    callbacks = CallbackList([cb])
    for hook in HOOKS:
        getattr(callbacks, hook)(*ARGS[hook])
    assert cb.steps == [1]


@pytest.mark.parametrize("hook", HOOKS)
def test_the_list_calls_each_callback_in_order_with_the_same_arguments(hook: str) -> None:
    log: list[tuple[str, str, tuple[Any, ...]]] = []
    callbacks = CallbackList([Recorder("a", log), Recorder("b", log)])
    getattr(callbacks, hook)(*ARGS[hook])
    assert log == [("a", hook, ARGS[hook]), ("b", hook, ARGS[hook])]
    assert len(callbacks) == 2 and [cb.name for cb in callbacks] == ["a", "b"]


def test_a_failing_hook_raises_and_stops_the_rest() -> None:
    log: list[tuple[str, str, tuple[Any, ...]]] = []

    class Broken(Callback):
        def on_step(self, step: int, metrics: Any) -> None:
            raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        CallbackList([Broken(), Recorder("after", log)]).on_step(1, {})
    assert log == []


def test_the_loggers_are_callbacks(tmp_path) -> None:
    assert isinstance(ConsoleProgress(), Callback) and isinstance(JsonlMetrics(tmp_path / "m.jsonl"), Callback)
