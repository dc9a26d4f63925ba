"""The rollout side of the RL loop (train rank 0): inference client, reward runner, workflow,
executor, and evaluation through the same servers.

``RolloutSide.open(cfg, addresses, model_dir, version)`` gives rank 0 its side: built in a child
process (:mod:`areal_tasks.rollout.process`) when ``rollout.own_process`` says so (``auto``:
when training runs on GPUs), else in rank 0's own.
``RolloutSide.build(cfg, addresses, tokenizer, version)`` wires it from the config:

- the client (``RemoteInferenceEngine``) over the servers the controller started;
- the reward (``rollout.reward``) in a process pool with a timeout per call;
- the workflow (``rollout.workflow``: a registered name or an import path, its options and the
  system prompt) with ``rollout.sampling`` (leave
  ``rollout.sampling.seed`` unset: one seed shared by every request makes the samples of a group
  identical, which leaves GRPO nothing to compare);
- the executor (``RolloutExecutor``) over the train split (loaded, or streamed with
  ``dataset.streaming``; prompts over ``dataset.max_prompt_len`` dropped as it is read, see
  :func:`prompt_filter`), with the algorithm's group filter
  (``Algorithm.group_filter``: DAPO's dynamic sampling; None for most), and the session trace
  (``<run_dir>/sessions.jsonl``, :func:`sessions_file`; the training reward is timed for it).

:meth:`RolloutSide.evaluate` runs the same workflow with the evaluation sampling
(``evaluation.temperature``, 0 = greedy; ``evaluation.n_samples`` per prompt) over the eval split and
returns the mean reward and the accuracy (share of episodes with reward 1); ``greedy=True`` measures
greedy decoding as well.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import SamplingParams
from areal_tasks.api.run_dir import RunPaths
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.evaluation import eval_sampling, run_episodes, samples_per_prompt
from areal_tasks.trace.sessions import timed_reward

if TYPE_CHECKING:
    from areal_tasks.api.workflow import RolloutWorkflow
    from areal_tasks.config.job import JobConfig
    from areal_tasks.inference.client import RemoteInferenceEngine
    from areal_tasks.rollout.executor import RolloutExecutor
    from areal_tasks.rollout.process import RolloutProcess
    from areal_tasks.rollout.rewards import RewardRunner

logger = logging.getLogger(__name__)


def own_process(setting: str) -> bool:
    """Whether ``rollout.own_process`` puts the rollout side in a child process (``auto``: with CUDA)."""
    if setting not in ("auto", "on", "off"):
        raise ConfigError(f"rollout.own_process must be auto, on or off, got {setting!r}")
    if setting == "auto":
        import torch

        return torch.cuda.is_available()
    return setting == "on"


def workflow_of(cfg: JobConfig, tokenizer: Any, sampling: SamplingParams, reward: Any) -> RolloutWorkflow:
    """The job's workflow (``rollout.workflow``) with ``sampling`` and the ``reward`` coroutine."""
    from areal_tasks.rollout.workflows import build_workflow

    return build_workflow(cfg.rollout.workflow, tokenizer, sampling, reward, max_prompt_len=cfg.dataset.max_prompt_len)


def sessions_file(cfg: JobConfig) -> Path | None:
    """Where the executor's session trace goes (``<run_dir>/sessions.jsonl``), or None when
    ``trace.sessions`` is off (it is on by default)."""
    if not cfg.trace.sessions:
        return None
    return RunPaths.of(cfg.experiment.run_dir).sessions


def prompt_filter(workflow: RolloutWorkflow, max_prompt_len: int) -> Callable[[Any], bool] | None:
    """Whether a record's prompt, rendered as ``workflow`` renders it, fits ``max_prompt_len``: the
    prompts the workflow would reject in every episode are dropped when the data is read instead.
    None for a workflow that does not render records itself (an agent's program does)."""
    render = getattr(workflow, "render_item", None)
    if render is None:
        return None
    return lambda record: len(render(record)) <= max_prompt_len


@dataclass
class RolloutSide:
    """What rank 0 holds to produce batches and to evaluate."""

    cfg: JobConfig
    client: RemoteInferenceEngine
    reward: RewardRunner
    executor: RolloutExecutor
    eval_workflow: RolloutWorkflow
    greedy_workflow: RolloutWorkflow

    @classmethod
    def open(cls, cfg: JobConfig, addresses: list[str], model_dir: str, version: int) -> RolloutSide | RolloutProcess:
        """The side as ``rollout.own_process`` says: in a child process (``auto``: on GPUs) or in this one."""
        if own_process(cfg.rollout.own_process):
            from areal_tasks.rollout.process import RolloutProcess

            return RolloutProcess.start(cfg, addresses, model_dir, version)
        from areal_tasks.models.tokenizer import load_tokenizer

        return cls.build(cfg, addresses, load_tokenizer(model_dir), version)

    @classmethod
    def build(cls, cfg: JobConfig, addresses: list[str], tokenizer: Any, version: int) -> RolloutSide:
        from areal_tasks.algo import build_algorithm
        from areal_tasks.datasets.registry import train_data
        from areal_tasks.inference.client import RemoteInferenceEngine
        from areal_tasks.rollout.executor import RolloutExecutor
        from areal_tasks.rollout.rewards import RewardRunner

        client = RemoteInferenceEngine.from_rollout(cfg.rollout, addresses, version=version)
        reward = RewardRunner(
            cfg.rollout.reward.fn, max_workers=cfg.rollout.reward.workers, timeout_s=cfg.rollout.reward.timeout_s
        )
        train_sampling = SamplingParams.from_config(cfg.rollout.sampling)
        workflow = workflow_of(cfg, tokenizer, train_sampling, timed_reward(reward.score))
        executor = RolloutExecutor.from_config(
            cfg.rollout,
            engine=client,
            workflow=workflow,
            dataset=train_data(cfg.dataset, prompt_filter(workflow, cfg.dataset.max_prompt_len)),
            batch_size=cfg.train.batch_size,
            seed=cfg.experiment.seed,
            shuffle=cfg.dataset.shuffle,
            group_filter=build_algorithm(cfg.algorithm).group_filter,
            version=version,
            servers_file=RunPaths.of(cfg.experiment.run_dir).inference_servers,
            sessions_file=sessions_file(cfg),
        )
        greedy_sampling = replace(train_sampling, temperature=0.0, seed=None)
        # the one evaluation rule (also evaluate_checkpoint's): rollout.sampling at
        # evaluation.temperature, no shared seed, evaluation.n_samples samples of each prompt
        return cls(
            cfg,
            client,
            reward,
            executor,
            workflow_of(cfg, tokenizer, eval_sampling(cfg), reward.score),
            workflow_of(cfg, tokenizer, greedy_sampling, reward.score),
        )

    @property
    def n_servers(self) -> int:
        """Number of inference servers the client talks to."""
        return len(self.client.addresses)

    def evaluate(self, n_prompts: int | None = None, *, greedy: bool = False) -> dict[str, float]:
        """Mean reward and accuracy of the served policy on the eval split (blocking).

        With ``evaluation.temperature > 0`` every prompt is sampled ``evaluation.n_samples`` times: the
        expected reward of the sampling policy, which is what RL optimises. ``greedy=True`` decodes
        each prompt once at temperature 0 instead (keys ``eval_greedy/...``).
        """
        from areal_tasks.datasets.registry import load_split

        records = load_split(self.cfg.dataset, "eval")
        limit = n_prompts or self.cfg.evaluation.max_eval_prompts
        records = records[:limit] if limit else records
        workflow, prefix, n_samples = self.eval_workflow, "eval", samples_per_prompt(self.cfg)
        if greedy:
            n_samples = 1
            workflow, prefix = self.greedy_workflow, "eval_greedy"
        started = time.perf_counter()
        trajectories = asyncio.run(
            run_episodes(
                self.client,
                workflow,
                [r for r in records for _ in range(n_samples)],
                self.cfg.rollout.max_concurrent_rollouts,
            )
        )
        rewards = [0.0 if traj is None else float(traj.reward) for traj in trajectories]
        return {
            f"{prefix}/reward": sum(rewards) / len(rewards),
            f"{prefix}/accuracy": sum(r >= 1.0 for r in rewards) / len(rewards),
            f"{prefix}/n": float(len(rewards)),
            f"{prefix}/wall_s": time.perf_counter() - started,
        }

    def close(self) -> None:
        """Stop the executor and the reward pool (idempotent)."""
        try:
            self.executor.stop()
        finally:
            self.reward.close()
