"""One rank's RL run: the objects the loop holds, which its callbacks see too.

:meth:`RLRun.open` builds the job's engines (:func:`~areal_tasks.trainer.engines.build_engines`),
loads the latest checkpoint into them (``recover.mode``) and, on rank 0, opens the rollout side at
the recovered version (in the rollout process or in this one: ``rollout.own_process``). The loop
advances :attr:`RLRun.version`; the checkpoint, evaluation and summary callbacks read the rest.
:meth:`RLRun.close` closes the rollout side and destroys the engines.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError
from areal_tasks.trainer.callbacks.base import CallbackList

if TYPE_CHECKING:
    from areal_tasks.checkpoint.manager import CheckpointManager
    from areal_tasks.checkpoint.state import TrainerState
    from areal_tasks.config.job import JobConfig
    from areal_tasks.rollout.process import RolloutProcess
    from areal_tasks.rollout.side import RolloutSide

logger = logging.getLogger(__name__)

__all__ = ["RLRun", "rl_steps"]


def rl_steps(cfg: JobConfig) -> int:
    """RL steps of the run: ``train.total_steps`` minus the SFT warm-start steps."""
    n = cfg.train.total_steps - cfg.train.sft_warmup_steps
    if n < 1:
        raise ConfigError(
            f"train.total_steps={cfg.train.total_steps} leaves no RL step after "
            f"train.sft_warmup_steps={cfg.train.sft_warmup_steps}; raise total_steps"
        )
    return n


@dataclass
class RLRun:
    """What one rank's RL loop holds (see the module docstring)."""

    cfg: JobConfig
    run_dir: Path
    #: ``"actor"`` and, when the job has them, ``"ref"`` and ``"critic"``.
    engines: dict[str, Any]
    manager: CheckpointManager
    #: the state of the checkpoint the run recovered from (None: it starts afresh).
    recovered: TrainerState | None
    #: rank 0's rollout side (None on the other ranks).
    side: RolloutSide | RolloutProcess | None
    #: RL steps of the whole run (:func:`rl_steps`).
    n_steps: int
    #: ``time.perf_counter()`` when this rank's run began.
    started: float
    #: the policy version: the recovered one, then one more per step.
    version: int = 0
    #: the callbacks of the loop (set once the run is open; callbacks raise hooks through it).
    callbacks: CallbackList = field(default_factory=CallbackList)

    @classmethod
    def open(cls, cfg: JobConfig, model_dir: str, addresses: list[str]) -> RLRun:
        """Build the engines, recover, and open the rollout side on rank 0."""
        from areal_tasks.checkpoint.manager import CheckpointManager
        from areal_tasks.rollout.side import RolloutSide
        from areal_tasks.trainer.engines import build_engines

        started = time.perf_counter()
        n_steps = rl_steps(cfg)
        engines = build_engines(cfg, model_dir, n_steps)
        manager = CheckpointManager.from_config(cfg)
        recovered = manager.recover(cfg.recover.mode, engines)
        version = recovered.version if recovered is not None else 0
        is_main = engines["actor"].parallel.rank == 0
        side = RolloutSide.open(cfg, addresses, model_dir, version) if is_main else None
        run_dir = Path(cfg.experiment.run_dir or ".")
        return cls(cfg, run_dir, engines, manager, recovered, side, n_steps, started, version)

    @property
    def actor(self) -> Any:
        """The policy's engine."""
        return self.engines["actor"]

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (it holds the rollout side)."""
        return self.side is not None

    @property
    def first_step(self) -> int:
        """The first step this process runs (the one after the recovered checkpoint's)."""
        return self.recovered.step + 1 if self.recovered is not None else 1

    def close(self) -> None:
        """Close the rollout side, then destroy the engines (each even if the one before failed)."""
        try:
            if self.side is not None:
                self.side.close()
        finally:
            for engine in self.engines.values():
                engine.destroy()
