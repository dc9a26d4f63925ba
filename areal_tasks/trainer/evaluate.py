"""Evaluate a model on the eval split through ONE embedded inference server.

``evaluate(cfg, model_dir, n_prompts)`` starts a server for ``model_dir`` (the job's
``rollout.backend`` command line, through ``ServerFleet`` and the Scheduler), renders the first
``n_prompts`` eval prompts with the chat template, generates with the client
(``RemoteInferenceEngine``; temperature ``evaluation.temperature``, 0 = greedy; at most
``rollout.sampling.max_new_tokens`` tokens), scores each completion with the verifiable reward
(exact integer match of ``Answer: N``) and stops the server. It returns accuracy, mean reward,
the fraction of completions that state an answer at all, and a few sample completions.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.datasets.answers import extract_answer
from areal_tasks.datasets.prompts import render_prompt
from areal_tasks.datasets.registry import load_split
from areal_tasks.datasets.reward import arithmetic_reward
from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.api.scheduler import Scheduler
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

#: sample completions kept in the result.
N_SAMPLES = 4


def _requests(cfg: JobConfig, tokenizer: Any, prompts: list[str]) -> list[ModelRequest]:
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.sampling.max_new_tokens,
        temperature=cfg.evaluation.temperature,
        seed=cfg.experiment.seed,
    )
    return [ModelRequest(input_ids=render_prompt(tokenizer, p), sampling=sampling) for p in prompts]


def evaluate(
    cfg: JobConfig, model_dir: str, n_prompts: int, *, scheduler: Scheduler | None = None, name: str = "eval"
) -> dict[str, Any]:
    """Accuracy of ``model_dir`` on the first ``n_prompts`` eval prompts (see the module docstring)."""
    from areal_tasks.inference.client import RemoteInferenceEngine
    from areal_tasks.inference.launch import ServerFleet, build_server_command
    from areal_tasks.models.tokenizer import load_tokenizer

    if n_prompts < 1:
        raise ConfigError(f"n_prompts={n_prompts} must be >= 1")
    records = load_split(cfg.dataset, "eval")[:n_prompts]
    tokenizer = load_tokenizer(model_dir)
    requests = _requests(cfg, tokenizer, [r.prompt for r in records])
    owned = scheduler is None
    if scheduler is None:
        from areal_tasks.launch import LocalScheduler

        scheduler = LocalScheduler(cfg.experiment.run_dir or ".")
    on_gpus = cfg.cluster.gpus_per_node > 0
    fleet = ServerFleet(
        scheduler, build_server_command(cfg, model_dir), 1, name=name,
        devices_per_server=1 if on_gpus else 0, hide_devices=not on_gpus,
        startup_timeout_s=cfg.rollout.server.startup_timeout_s, max_restarts=0,
    )
    started = time.perf_counter()
    try:
        addresses = fleet.start()
        engine = RemoteInferenceEngine.from_rollout(cfg.rollout, addresses)
        responses = engine.generate_batch(requests)
    finally:
        fleet.stop()
        if owned:
            scheduler.stop_all()
    completions = [tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in responses]
    rewards = [arithmetic_reward(c, rec.answer) for c, rec in zip(completions, records)]
    answered = sum(extract_answer(c) is not None for c in completions)
    result = {
        "model_dir": str(model_dir),
        "n_prompts": len(records),
        "accuracy": sum(r == 1.0 for r in rewards) / len(rewards),
        "mean_reward": sum(rewards) / len(rewards),
        "answer_rate": answered / len(completions),
        "wall_s": time.perf_counter() - started,
        "samples": [
            {"prompt": rec.prompt, "answer": rec.answer, "completion": c, "reward": r}
            for rec, c, r in list(zip(records, completions, rewards))[:N_SAMPLES]
        ],
    }
    logger.info("eval %s: accuracy %.3f on %d prompts", model_dir, result["accuracy"], len(records))
    return result
