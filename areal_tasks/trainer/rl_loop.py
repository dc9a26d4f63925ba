"""The RL loop of one train rank (SPMD: every rank runs this; rank 0 also owns the rollout side).

Before the first step the run (:class:`~areal_tasks.trainer.rl_run.RLRun`) recovers from the latest
checkpoint (``recover.mode``) and, when it did, restores the rollout executor's state and pushes the
recovered weights to the servers. Per step ``k`` (policy version ``k - 1`` before it, ``k`` after):

1. rank 0 takes a batch from the rollout executor (which kept generating while the previous step
   trained, up to ``rollout.max_head_offpolicyness`` versions ahead), appends its episode ids to
   ``<run_dir>/rollout_episodes.jsonl`` and broadcasts it; a rollout failure is broadcast too, so
   every rank stops (once the step trained, rank 0 tells the executor, ``mark_trained(step)``:
   the session trace, ``<run_dir>/sessions.jsonl``, writes the batch's episodes then);
2. every rank packs it and runs :class:`~areal_tasks.trainer.rl_step.RLStep` (ref/critic/prox
   forwards, advantages, PPO mini-batches, critic);
3. the weight update (:class:`~areal_tasks.trainer.weight_publisher.WeightPublisher`): the actor's
   new weights to the servers, as ``rollout.weight_update`` says;
4. the step's metrics go through the callbacks (``trainer/callbacks/``): the evaluation every
   ``evaluation.freq_steps`` joins them, the loggers log them, then a checkpoint every
   ``saver.freq_steps`` is saved.

The side effects are callbacks (:mod:`areal_tasks.trainer.callbacks.base` has the hooks' order):
the starting and final evaluations, checkpoints, ``<run_dir>/rl_summary.json``, the loggers. A
failure is reported to the callbacks (``fail``) and re-raised. At the end (and on a failure) the
publisher is closed before the rollout side and the engines.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.errors import RolloutError
from areal_tasks.rollout.episodes import append_episode_log
from areal_tasks.trace import set_step, span
from areal_tasks.trainer.callbacks.base import Callback, CallbackList
from areal_tasks.trainer.collectives import broadcast_object

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.rollout.process import RolloutProcess
    from areal_tasks.rollout.side import RolloutSide
    from areal_tasks.trainer.rl_run import RLRun
    from areal_tasks.trainer.weight_publisher import WeightPublisher

logger = logging.getLogger(__name__)


@dataclass
class _Failure:
    """A rollout failure on rank 0, broadcast in place of a batch so every rank stops."""

    message: str


def run_rl_rank(
    cfg: JobConfig, model_dir: str, addresses: list[str], callbacks: list[Callback] | None = None
) -> dict[str, Any]:
    """Run this rank's RL loop (see the module docstring); rank 0 returns the summary.

    ``callbacks``: the loggers to use on rank 0 instead of those of the ``tracking`` section (the
    run's evaluation, checkpoints and summary are callbacks too, always there).
    """
    from areal_tasks.algo import build_algorithm
    from areal_tasks.trainer.rl_batch import pack_trajectories
    from areal_tasks.trainer.rl_run import RLRun
    from areal_tasks.trainer.rl_step import RLStep
    from areal_tasks.trainer.tracking import callbacks_from_config
    from areal_tasks.trainer.weight_publisher import WeightPublisher

    run = RLRun.open(cfg, model_dir, addresses)
    publisher = WeightPublisher(cfg, run.actor, run.side, run.run_dir)
    step_runner = RLStep(
        run.actor,
        build_algorithm(cfg.algorithm),
        cfg.rollout.group_size,
        ref=run.engines.get("ref"),
        critic=run.engines.get("critic"),
        ppo_n_minibatches=cfg.actor.ppo_n_minibatches,
    )
    run.callbacks = CallbackList(callbacks_from_config(cfg, run.run_dir, run=run, loggers=callbacks))
    summary: dict[str, Any] = {}
    try:
        _recover(run, publisher)
        run.callbacks.on_start(run.n_steps - run.first_step + 1)
        if run.side is not None:
            run.side.executor.start()
        for step in range(run.first_step, run.n_steps + 1):
            set_step(step)
            with span("rl step", "train"):
                _one_step(run, cfg, step, step_runner, publisher, pack_trajectories)
        set_step(None)
        if run.side is not None:
            run.side.executor.stop()  # nothing more is generated for training while the final policy is evaluated
        run.callbacks.on_train_end(summary)  # the final evaluation, the run's facts
        run.callbacks.on_end(summary)  # rl_summary.json, the loggers; the checkpoint manager closes
    except BaseException as exc:
        run.callbacks.fail(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        try:
            publisher.close()  # the servers leave the weight-update group while rank 0 destroys it
        finally:
            run.close()
    return summary


def _one_step(run: RLRun, cfg: JobConfig, step: int, step_runner: Any, publisher: WeightPublisher, pack: Any) -> None:
    """Step ``step`` of the loop: batch, compute, weight update, callbacks (module docstring)."""
    step_started = time.perf_counter()
    with span("batch wait", "rollout"):
        payload = _next_batch(run.side, cfg)
    if isinstance(payload, _Failure):
        raise RolloutError(f"rollout failed before step {step}: {payload.message}")
    if run.side is not None:
        append_episode_log(RunPaths.of(run.run_dir).rollout_episodes, step, payload)
    waited = time.perf_counter() - step_started
    batch = pack(payload, cfg.rollout.group_size, run.version)
    train_started = time.perf_counter()
    with span("train step", "train"):
        metrics = step_runner.run(batch, step)
    metrics["perf/train_s"] = time.perf_counter() - train_started
    with span("weight update", "weights", version=run.version + 1):
        metrics.update(publisher.publish(run.version + 1))
    run.version += 1
    if run.side is not None:
        run.side.executor.mark_trained(step)  # the session trace writes the batch's episodes
    metrics.update(_step_figures(run, waited, time.perf_counter() - step_started, metrics["n_tokens"]))
    run.callbacks.on_step_metrics(step, metrics)  # the evaluation's join the step's
    run.callbacks.on_step(step, metrics)  # logged before the save: a job killed after it skips no step
    run.callbacks.on_step_end(step, metrics)  # the checkpoint


def _recover(run: RLRun, publisher: WeightPublisher) -> None:
    """After a recovery: the rollout executor's state back, the recovered weights to the servers."""
    state = run.recovered
    if state is None:
        return
    logger.info("recovered step %d (version %d): pushing its weights to the servers", state.step, run.version)
    if run.side is not None and state.executor:
        run.side.executor.load_state_dict(state.executor)
    publisher.publish(run.version)


def _step_figures(run: RLRun, waited: float, step_s: float, n_tokens: float) -> dict[str, float]:
    """The step's timings, throughput and version, and (rank 0) the batch's rollout statistics."""
    figures = {
        "perf/rollout_wait_s": waited,
        "perf/step_s": step_s,
        "perf/tokens_per_s": n_tokens / max(step_s, 1e-9),
        "version": float(run.version),
    }
    if run.side is not None:
        stats = run.side.executor.last_batch_stats()
        figures.update({f"rollout/{k}": float(v) for k, v in stats.items() if isinstance(v, (int, float))})
    return figures


def _next_batch(side: RolloutSide | RolloutProcess | None, cfg: JobConfig) -> Any:
    """Rank 0 takes a batch from the executor; every rank receives it (or the failure)."""
    payload: Any = None
    if side is not None:
        try:
            payload = side.executor.prepare_batch(timeout_s=max(600.0, 4 * cfg.rollout.request_timeout_s))
        except RolloutError as exc:
            payload = _Failure(str(exc))
    return broadcast_object(payload)
