"""The evaluation harness: a model, one or more eval sets, K samples per item -> pass@k, maj@k, ...

:func:`run_eval` checks its inputs first (model directory, reward, ``k <= n_samples``, the eval
sets readable: every mistake is an :class:`~areal_tasks.errors.EvaluationError` or ``RewardError``
before anything starts), then serves the model with ONE inference server of the config's
``rollout.backend`` (:func:`~areal_tasks.inference.launch.one_server.one_server`: embedded by
default, vLLM or SGLang when the config says so) and hands it to :func:`sample_and_score`.

:func:`sample_and_score` is the part that needs only an :class:`~areal_tasks.api.inference.InferenceEngine`
(tests drive it with a scripted one): it runs ``n_samples`` episodes of the job's workflow per item
(the trainer's own evaluation episodes: chat template, system prompt, ``dataset.max_prompt_len``;
``rollout.sampling`` at the evaluation temperature, no shared seed; greedy at temperature 0),
scores each completion with the reward in a :class:`~areal_tasks.rollout.rewards.RewardRunner`,
and extracts each completion's answer with the reward's extractor
(:mod:`areal_tasks.evaluation.extractors`). A sample is correct when its reward is at least 1; a
rejected episode (prompt too long, empty output) is a wrong sample without an answer.
:mod:`areal_tasks.evaluation.report` turns the outcome into the JSON summary and per-item records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EvaluationError
from areal_tasks.evaluation.extractors import AnswerExtractor, extractor_for
from areal_tasks.evaluation.metrics import ItemResult, SampleResult
from areal_tasks.evaluation.report import EvalRun, SetOutcome, build_run
from areal_tasks.evaluation.sets import EvalSet, load_sets

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine
    from areal_tasks.api.scheduler import Scheduler
    from areal_tasks.api.workflow import Trajectory
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["EvalOptions", "run_eval", "sample_and_score"]


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate; None takes the config's value.

    ``n_samples``: completions per item; ``k``: the k of pass@k and maj@k (None: ``n_samples``);
    ``temperature``: None = ``evaluation.temperature``; ``reward``: a registered name or
    ``package.module:function`` (None = ``rollout.reward.fn``); ``max_items``: the first items of each set.
    """

    n_samples: int = 1
    k: int | None = None
    temperature: float | None = None
    reward: str | None = None
    max_items: int | None = None

    def resolve(self, cfg: JobConfig) -> EvalOptions:
        """Every None filled from ``cfg`` (``max_items`` stays None: all); EvaluationError for bad values."""
        n = self.n_samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise EvaluationError(f"n_samples={n!r} must be an integer >= 1 (completions drawn per item)")
        k = n if self.k is None else self.k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise EvaluationError(f"k={k!r} must be an integer >= 1")
        if k > n:
            raise EvaluationError(
                f"k={k} is larger than n_samples={n}: pass@k and maj@k need at least k samples per item; "
                f"raise --n-samples to {k} or lower --k"
            )
        temperature = cfg.evaluation.temperature if self.temperature is None else float(self.temperature)
        if not temperature >= 0.0:
            raise EvaluationError(f"temperature={temperature} must be >= 0 (0 = greedy)")
        if n > 1 and temperature == 0.0:
            logger.warning(
                "%d samples per item at temperature 0 are %d copies of the greedy answer: pass@k equals pass@1; "
                "give --temperature > 0 to sample",
                n,
                n,
            )
        reward = self.reward if self.reward is not None else cfg.rollout.reward.fn
        return dataclasses.replace(self, n_samples=n, k=k, temperature=temperature, reward=reward)


def check_model_dir(model_dir: str) -> None:
    """EvaluationError unless ``model_dir`` names a model a server can load: a directory holding an HF
    ``config.json``, a hub id whose ``config.json`` the hub serves, or ``tiny:<family>``."""
    from areal_tasks.errors import ModelError
    from areal_tasks.models.detect import resolve_config_path

    path = Path(model_dir).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        raise EvaluationError(
            f"model directory {model_dir!r} has no config.json: it is not a Hugging Face model directory "
            "(a DCP checkpoint must be exported first: `areal checkpoint export`)"
        )
    if path.is_absolute() and not path.exists():
        raise EvaluationError(
            f"model directory {model_dir!r} does not exist; give a Hugging Face model directory "
            "(config.json, tokenizer, weights), e.g. one `areal model tiny --out DIR` writes or an exported checkpoint"
        )
    try:
        resolve_config_path(model_dir)
    except ModelError as exc:
        raise EvaluationError(f"--model {model_dir!r}: {exc}") from exc


def eval_config(cfg: JobConfig, options: EvalOptions) -> JobConfig:
    """``cfg`` with the evaluation section set to ``options``' temperature and samples."""
    evaluation = dataclasses.replace(cfg.evaluation, temperature=options.temperature, n_samples=options.n_samples)
    return dataclasses.replace(cfg, evaluation=evaluation)


def _sample(trajectory: Trajectory | None, extractor: AnswerExtractor) -> tuple[SampleResult, float]:
    if trajectory is None:
        return SampleResult(correct=False, answer=None, text="", n_tokens=0), 0.0
    reward = float(trajectory.reward)
    text = str(trajectory.metadata.get("completion", ""))
    n_tokens = trajectory.metadata.get("n_output_tokens")
    sample = SampleResult(
        correct=reward >= 1.0,
        answer=extractor.extract(text),
        text=text,
        n_tokens=int(n_tokens) if n_tokens is not None else None,
    )
    return sample, reward


def score_set(
    eval_set: EvalSet, trajectories: Sequence[Trajectory | None], n_samples: int, extractor: AnswerExtractor
) -> SetOutcome:
    """The items of ``eval_set`` from its ``n_samples`` trajectories per record (record-major order)."""
    scored = [_sample(t, extractor) for t in trajectories]
    if any(s.n_tokens is None for s, _ in scored):  # a workflow that does not count tokens: lengths in chars
        scored = [(dataclasses.replace(s, n_tokens=None), r) for s, r in scored]
    items, rewards = [], []
    for i, record in enumerate(eval_set.records):
        chunk = scored[i * n_samples : (i + 1) * n_samples]
        items.append(ItemResult(f"{eval_set.name}/{i}", [s for s, _ in chunk], reference=record.answer))
        rewards.append([r for _, r in chunk])
    return SetOutcome(eval_set, items, rewards)


async def _episodes(
    engine: InferenceEngine, workflow: Any, records: list[Any], concurrency: int, on_done: Callable[[], None]
) -> list[Trajectory | None]:
    from areal_tasks.rollout.evaluation import run_episodes

    try:
        return await run_episodes(engine, workflow, records, concurrency, on_done)
    finally:
        close = getattr(engine, "aclose", None)
        if close is not None:
            await close()


def sample_and_score(
    engine: InferenceEngine,
    tokenizer: Any,
    cfg: JobConfig,
    sets: Sequence[EvalSet],
    options: EvalOptions,
    *,
    progress: bool = True,
) -> list[SetOutcome]:
    """Sample ``options.n_samples`` completions of every item of ``sets`` through ``engine`` and score
    them (see the module docstring); ``options`` must be resolved. Closes ``engine``."""
    from tqdm import tqdm

    from areal_tasks.rollout.evaluation import eval_sampling
    from areal_tasks.rollout.rewards import RewardRunner
    from areal_tasks.rollout.side import workflow_of

    assert options.reward is not None and options.temperature is not None, "resolve the options first"
    n = options.n_samples
    cfg = eval_config(cfg, options)
    extractor = extractor_for(options.reward)
    episodes = [record for eval_set in sets for record in eval_set.records for _ in range(n)]
    reward = cfg.rollout.reward
    runner = RewardRunner(options.reward, max_workers=reward.workers, timeout_s=reward.timeout_s)
    bar = tqdm(total=len(episodes), desc="eval", unit="sample", disable=not progress, dynamic_ncols=True)
    try:
        workflow = workflow_of(cfg, tokenizer, eval_sampling(cfg), runner.score)
        trajectories = asyncio.run(
            _episodes(engine, workflow, episodes, cfg.rollout.max_concurrent_rollouts, lambda: bar.update(1))
        )
    finally:
        bar.close()
        runner.close()
    outcomes, start = [], 0
    for eval_set in sets:
        end = start + len(eval_set.records) * n
        outcomes.append(score_set(eval_set, trajectories[start:end], n, extractor))
        start = end
    return outcomes


def run_eval(
    cfg: JobConfig,
    model_dir: str,
    data: Sequence[str] = (),
    options: EvalOptions = EvalOptions(),
    *,
    scheduler: Scheduler | None = None,
    name: str = "eval",
    progress: bool = True,
) -> EvalRun:
    """Evaluate ``model_dir`` on the sets ``data`` (``[]``: the config's eval split); see the module docstring.

    ``scheduler`` runs the server (None: one made for ``cfg`` and stopped after); ``name`` names its worker group.
    """
    from areal_tasks.inference.launch.one_server import one_server
    from areal_tasks.models.tokenizer import load_tokenizer
    from areal_tasks.rollout.rewards import resolve_reward

    started = time.perf_counter()
    options = options.resolve(cfg)
    assert options.reward is not None
    resolve_reward(options.reward)  # an unknown reward is a RewardError naming the registered ones, before any server
    check_model_dir(model_dir)
    sets = load_sets(cfg, data, options.max_items)
    tokenizer = load_tokenizer(model_dir)
    with one_server(eval_config(cfg, options), model_dir, scheduler=scheduler, name=name) as served:
        outcomes = sample_and_score(served.engine(), tokenizer, served.cfg, sets, options, progress=progress)
    facts = {
        "model": str(model_dir),
        "backend": cfg.rollout.backend,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    return build_run(outcomes, options, facts)
