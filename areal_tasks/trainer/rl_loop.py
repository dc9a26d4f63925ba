"""The RL loop of one train rank (SPMD: every rank runs this; rank 0 also owns the rollout side).

Per step ``k`` (policy version ``k - 1`` before it, ``k`` after it):

1. rank 0 takes a batch from the :class:`~areal_tasks.rollout.executor.RolloutExecutor` (which
   kept generating while the previous step trained, up to ``rollout.max_head_offpolicyness``
   versions ahead) and broadcasts it; a rollout failure is broadcast too, so every rank stops;
2. every rank packs it and runs :class:`~areal_tasks.trainer.rl_step.RLStep` (ref/critic/prox
   forwards, advantages, PPO mini-batches, critic);
3. the weight update (:class:`~areal_tasks.trainer.weight_publisher.WeightPublisher`): the
   actor's new weights to the servers, as ``rollout.weight_update`` says;
4. evaluation every ``evaluation.freq_steps``, a checkpoint every ``saver.freq_steps`` (engines +
   the executor's position and counters), metrics to the callbacks (rank 0).

At the end (and on a failure) the publisher is closed before the engines are destroyed.

Before the first step it recovers from the latest checkpoint (``recover.mode``) and, when it did,
pushes the recovered weights to the servers. It evaluates the starting policy (``reward_before``)
and the final one (``reward_after``) and writes ``<run_dir>/rl_summary.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.evaluation import samples_per_prompt
from areal_tasks.trainer.collectives import broadcast_object

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.rollout.process import RolloutProcess
    from areal_tasks.rollout.side import RolloutSide

logger = logging.getLogger(__name__)


@dataclass
class _Failure:
    """A rollout failure on rank 0, broadcast in place of a batch so every rank stops."""

    message: str


def rl_steps(cfg: JobConfig) -> int:
    """RL steps of the run: ``train.total_steps`` minus the SFT warm-start steps."""
    n = cfg.train.total_steps - cfg.train.sft_warmup_steps
    if n < 1:
        raise ConfigError(
            f"train.total_steps={cfg.train.total_steps} leaves no RL step after "
            f"train.sft_warmup_steps={cfg.train.sft_warmup_steps}; raise total_steps"
        )
    return n


def run_rl_rank(
    cfg: JobConfig, model_dir: str, addresses: list[str], callbacks: list[Any] | None = None
) -> dict[str, Any]:
    """Run this rank's RL loop (see the module docstring); rank 0 returns the summary."""
    from areal_tasks.algo import build_algorithm
    from areal_tasks.checkpoint.layout import step_dir
    from areal_tasks.checkpoint.manager import CheckpointManager
    from areal_tasks.checkpoint.state import TrainerState
    from areal_tasks.rollout.side import RolloutSide
    from areal_tasks.trainer.engines import build_engines
    from areal_tasks.trainer.rl_batch import pack_trajectories
    from areal_tasks.trainer.rl_step import RLStep
    from areal_tasks.trainer.tracking import callbacks_from_config
    from areal_tasks.trainer.weight_publisher import WeightPublisher

    started = time.perf_counter()
    run_dir = Path(cfg.experiment.run_dir or ".")
    n_steps = rl_steps(cfg)
    engines = build_engines(cfg, model_dir, n_steps)
    actor = engines["actor"]
    is_main = actor.parallel.rank == 0
    manager = CheckpointManager.from_config(cfg)
    state = manager.recover(cfg.recover.mode, engines)
    version = state.version if state is not None else 0
    first_step = state.step + 1 if state is not None else 1
    side = RolloutSide.open(cfg, addresses, model_dir, version) if is_main else None
    publisher = WeightPublisher(cfg, actor, side, run_dir)
    step_runner = RLStep(
        actor,
        build_algorithm(cfg.algorithm),
        cfg.rollout.group_size,
        ref=engines.get("ref"),
        critic=engines.get("critic"),
        ppo_n_minibatches=cfg.actor.ppo_n_minibatches,
    )
    if callbacks is None:
        callbacks = callbacks_from_config(cfg, run_dir) if is_main else []
    summary: dict[str, Any] = {}
    try:
        if state is not None:
            logger.info("recovered step %d (version %d): pushing its weights to the servers", state.step, version)
            if side is not None and state.executor:
                side.executor.load_state_dict(state.executor)
            publisher.publish(version)
        before = {**side.evaluate(), **side.evaluate(greedy=True)} if side is not None else {}
        if side is not None:
            side.executor.start()
            logger.info(
                "starting policy: eval reward %.3f, accuracy %.3f", before["eval/reward"], before["eval/accuracy"]
            )
        for cb in callbacks:
            cb.on_start(n_steps - first_step + 1)
        last_metrics: dict[str, float] = {}
        for step in range(first_step, n_steps + 1):
            step_started = time.perf_counter()
            payload = _next_batch(side, cfg)
            if isinstance(payload, _Failure):
                raise RolloutError(f"rollout failed before step {step}: {payload.message}")
            waited = time.perf_counter() - step_started
            batch = pack_trajectories(payload, cfg.rollout.group_size, version)
            train_started = time.perf_counter()
            metrics = step_runner.run(batch)
            metrics["perf/train_s"] = time.perf_counter() - train_started
            metrics.update(publisher.publish(version + 1))
            version += 1
            metrics["perf/rollout_wait_s"] = waited
            metrics["perf/step_s"] = time.perf_counter() - step_started
            metrics["perf/tokens_per_s"] = metrics["n_tokens"] / max(metrics["perf/step_s"], 1e-9)
            metrics["version"] = float(version)
            if side is not None:
                metrics.update(
                    {
                        f"rollout/{k}": float(v)
                        for k, v in side.executor.last_batch_stats().items()
                        if isinstance(v, (int, float))
                    }
                )
            freq = cfg.evaluation.freq_steps
            if side is not None and freq and step % freq == 0 and step != n_steps:
                evaluated = side.evaluate()
                metrics.update(evaluated)
                _notify(callbacks, "on_eval", step, evaluated, None)
            # metrics first: a job killed after the save would resume past this step and never
            # log it (killed before the save, it redoes the step and logs it again)
            for cb in callbacks:
                cb.on_step(step, metrics)
            last_metrics = metrics
            if manager.should_save(step, last=step == n_steps):
                executor_state = side.executor.state_dict() if side is not None else {}
                ticket = manager.save(
                    step,
                    engines,
                    TrainerState(step=step, version=version, executor=executor_state),
                    {k: v for k, v in metrics.items() if k.startswith(("reward/", "eval/"))},
                    config=cfg,
                )
                if ticket.done():
                    url = manager.layout.url(step_dir(step))
                    _notify(callbacks, "on_checkpoint", step, url, ticket.wait().to_dict())
        if side is not None:
            side.executor.stop()  # nothing more is generated for training while the final policy is evaluated
            after = {**side.evaluate(), **side.evaluate(greedy=True)}
            _notify(callbacks, "on_eval", n_steps, after, None)
            summary = {
                "reward_before": before["eval/reward"],
                "reward_after": after["eval/reward"],
                "accuracy_before": before["eval/accuracy"],
                "accuracy_after": after["eval/accuracy"],
                "greedy_accuracy_before": before["eval_greedy/accuracy"],
                "greedy_accuracy_after": after["eval_greedy/accuracy"],
                "eval_temperature": cfg.evaluation.temperature,
                "eval_samples_per_prompt": samples_per_prompt(cfg),
                "eval_prompts": int(after["eval_greedy/n"]),
                "steps": n_steps,
                "first_step": first_step,
                "final_version": version,
                "wall_seconds": time.perf_counter() - started,
                "last_step": last_metrics,
                "executor": side.executor.stats(),
            }
            RunPaths.of(run_dir).rl_summary.write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
            for cb in callbacks:
                cb.on_end(summary)
        manager.close()
    except BaseException as exc:
        _notify(callbacks, "fail", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        try:
            publisher.close()  # the servers leave the weight-update group while rank 0 destroys it
        finally:
            if side is not None:
                side.close()
            for engine in engines.values():
                engine.destroy()
    return summary


def _notify(callbacks: list[Any], hook: str, *args: Any) -> None:
    """Call an optional hook (``on_eval``, ``on_checkpoint``) on the callbacks that have it."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            method(*args)


def _next_batch(side: RolloutSide | RolloutProcess | None, cfg: JobConfig) -> Any:
    """Rank 0 takes a batch from the executor; every rank receives it (or the failure)."""
    payload: Any = None
    if side is not None:
        try:
            payload = side.executor.prepare_batch(timeout_s=max(600.0, 4 * cfg.rollout.request_timeout_s))
        except RolloutError as exc:
            payload = _Failure(str(exc))
    return broadcast_object(payload)
