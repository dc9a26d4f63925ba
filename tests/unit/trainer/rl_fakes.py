"""Fakes for the RL loop and its callbacks: a rollout side, a checkpoint manager, engines, a weight
publisher and a step runner that record what they were asked, in one shared event log, so a test
can check the order of the loop's side effects without servers, engines or torch.distributed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from areal_tasks.api.train_engine import ParallelInfo
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.config import load_config
from areal_tasks.trainer.callbacks import HOOKS, Callback, CallbackList
from areal_tasks.trainer.rl_run import RLRun

Log = list[tuple[Any, ...]]


class FakeExecutor:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.version = 0
        self.trained_steps: list[int] = []

    def start(self) -> FakeExecutor:
        self.log.append(("executor.start",))
        return self

    def stop(self) -> None:
        self.log.append(("executor.stop",))

    def prepare_batch(self, timeout_s: float | None = None) -> list[str]:
        self.log.append(("executor.prepare_batch",))
        return ["trajectory"] * 4

    def last_batch_stats(self) -> dict[str, float]:
        return {"reward_mean": 0.5, "wait_s": 0.01}

    def state_dict(self) -> dict[str, Any]:
        return {"format": 1, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.log.append(("executor.load_state_dict", state))

    def stats(self) -> dict[str, Any]:
        return {"accepted": 16}

    def mark_trained(self, step: int) -> None:
        self.trained_steps.append(step)


class FakeSide:
    n_servers = 1

    def __init__(self, log: Log) -> None:
        self.log = log
        self.executor = FakeExecutor(log)
        self.evaluations = 0

    def evaluate(self, n_prompts: int | None = None, *, greedy: bool = False) -> dict[str, float]:
        self.log.append(("evaluate", "greedy" if greedy else "sampled"))
        self.evaluations += 1
        prefix = "eval_greedy" if greedy else "eval"
        value = 0.1 * self.evaluations
        return {f"{prefix}/reward": value, f"{prefix}/accuracy": value, f"{prefix}/n": 8.0, f"{prefix}/wall_s": 0.0}

    def close(self) -> None:
        self.log.append(("side.close",))


@dataclass
class FakeTicket:
    step: int
    complete: bool

    def done(self) -> bool:
        return self.complete

    def wait(self) -> Any:
        return SimpleNamespace(to_dict=lambda: {"step": self.step})


@dataclass
class FakeManager:
    log: Log
    freq: int = 2
    complete: bool = True
    recovered: TrainerState | None = None
    saved: list[tuple[int, TrainerState, dict[str, float]]] = field(default_factory=list)
    layout: Any = field(default_factory=lambda: SimpleNamespace(url=lambda path: f"file:///ckpt/{path}"))

    def should_save(self, step: int, *, last: bool = False) -> bool:
        return last or step % self.freq == 0

    def save(self, step: int, engines: Any, state: TrainerState, metrics: dict[str, float], config: Any) -> FakeTicket:
        self.log.append(("save", step))
        self.saved.append((step, state, dict(metrics)))
        return FakeTicket(step, self.complete)

    def recover(self, mode: str, engines: Any) -> TrainerState | None:
        return self.recovered

    def close(self) -> None:
        self.log.append(("manager.close",))


class FakeEngine:
    def __init__(self, log: Log, rank: int = 0) -> None:
        self.log = log
        self.parallel = ParallelInfo(world_size=2, rank=rank, dp_size=2, dp_rank=rank)

    def destroy(self) -> None:
        self.log.append(("engine.destroy",))


class Recorder(Callback):
    """Logs every hook with its step (and, for steps, the metric keys it saw)."""

    def __init__(self, log: Log, name: str = "logger") -> None:
        self.log, self.name = log, name

    def __getattribute__(self, attr: str) -> Any:
        if attr not in HOOKS:
            return super().__getattribute__(attr)
        log, name = super().__getattribute__("log"), super().__getattribute__("name")

        def hook(*args: Any) -> None:
            shown: tuple[Any, ...] = args
            if attr in ("on_step", "on_step_metrics", "on_step_end"):
                shown = (args[0], frozenset(args[1]))
            log.append((f"{name}.{attr}", *shown))

        return hook


def job(tmp_path: Path, *overrides: str) -> Any:
    """The demo config with a run directory and the given overrides."""
    return load_config("configs/demo_grpo.yaml", [f"experiment.run_dir={tmp_path}", *overrides])


def fake_run(tmp_path: Path, log: Log, *overrides: str, n_steps: int = 4, main: bool = True, **manager: Any) -> RLRun:
    """An RLRun over the fakes (the loop's view), its callbacks still empty."""
    return RLRun(
        cfg=job(tmp_path, *overrides),
        run_dir=tmp_path,
        engines={"actor": FakeEngine(log, 0 if main else 1)},
        manager=FakeManager(log, **manager),  # type: ignore[arg-type]
        recovered=None,
        side=FakeSide(log) if main else None,  # type: ignore[arg-type]
        n_steps=n_steps,
        started=0.0,
        callbacks=CallbackList(),
    )
