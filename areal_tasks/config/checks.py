"""Single-section value checks (ranges, non-empty names), collected rather than raised.

Each ``check_*`` function appends ``"<field path>: <problem>"`` lines to a :class:`Problems`;
:func:`areal_tasks.config.validate.validate_config` runs them all, adds the cross-section rules and
raises one :class:`~areal_tasks.errors.ConfigError` listing everything.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from areal_tasks.config.cluster import ClusterConfig
from areal_tasks.config.engine import EngineConfig
from areal_tasks.config.rollout import ENV_NAME, RolloutConfig
from areal_tasks.config.sections import (
    ColumnsConfig,
    DatasetConfig,
    EvaluationConfig,
    ExperimentConfig,
    SaverConfig,
    StorageConfig,
    TrackingConfig,
    TrainConfig,
)
from areal_tasks.weights.registry import WEIGHT_TRANSPORTS

logger = logging.getLogger(__name__)

# Upper bounds on counts: far above any real run, low enough that a typo (``total_steps=1e23``, one
# zero too many) is refused before it allocates memory or loops for ever.
#: steps, and step intervals.
MAX_STEPS = 10**9
#: samples: batch, group and eval sizes, rollouts in flight.
MAX_SAMPLES = 10**7
#: tokens: prompt and generation lengths, context windows.
MAX_TOKENS = 10**7
#: worker processes of one kind on a node (reward workers).
MAX_WORKERS = 4096
#: retries and restarts.
MAX_RETRIES = 1000


class Problems:
    """An ordered list of ``"<path>: <problem>"`` lines."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")

    def number(
        self,
        path: str,
        value: Any,
        *,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
        high_open: bool = False,
        optional: bool = False,
        cap: float | None = None,
    ) -> bool:
        """Check that ``value`` is a finite number with ``low <= value <= high`` (open ends when
        asked) and at most ``cap`` (a sanity bound, named only when exceeded); record and return
        False if not."""
        if value is None and optional:
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.add(path, f"must be a number{' or null' if optional else ''}, got {value!r}")
            return False
        if isinstance(value, float) and not math.isfinite(value):
            self.add(path, f"must be a finite number{' (or null)' if optional else ''}, got {value!r}")
            return False
        low_ok = low is None or (value > low if low_open else value >= low)
        high_ok = high is None or (value < high if high_open else value <= high)
        if low_ok and high_ok:
            if cap is not None and value > cap:
                self.add(path, f"{value!r} is implausibly large (at most {cap:,} is accepted); check for a typo")
                return False
            return True
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low}")
        if high is not None:
            bounds.append(f"{'<' if high_open else '<='} {high}")
        self.add(path, f"must be {' and '.join(bounds)}{' (or null)' if optional else ''}, got {value!r}")
        return False

    def non_empty(self, path: str, value: str | None, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str) or not value.strip():
            self.add(path, f"must be a non-empty string, got {value!r}")


def check_experiment(p: Problems, exp: ExperimentConfig) -> None:
    for name in ("name", "trial"):
        value = getattr(exp, name)
        p.non_empty(f"experiment.{name}", value)
        if isinstance(value, str) and (any(c in value for c in "/\\") or value.strip() in (".", "..")):
            p.add(
                f"experiment.{name}",
                f"becomes a directory name, so it cannot contain '/' or '\\' or be '.'/'..'; got {value!r}",
            )
    p.non_empty("experiment.run_dir", exp.run_dir, optional=True)
    p.number("experiment.seed", exp.seed, low=0, high=2**32 - 1)


def check_scheduler(p: Problems, cluster: ClusterConfig) -> None:
    """``cluster.scheduler`` must be a *built* kind (:mod:`areal_tasks.launch.registry`): the config
    grammar also accepts the planned ones, which are refused here, before anything starts."""
    from areal_tasks.launch.registry import unsupported_reason

    reason = unsupported_reason(cluster.scheduler)
    if reason is not None:
        p.add("cluster.scheduler", reason)


def check_storage(p: Problems, storage: StorageConfig) -> None:
    """``storage.url`` must parse (:func:`storage.url.parse_url`): among others, a URL that carries
    credentials is refused here, before it reaches a log, a record or ``ps``."""
    p.non_empty("storage.url", storage.url, optional=True)
    if not isinstance(storage.url, str) or not storage.url.strip():
        return
    from storage.errors import StorageConfigError
    from storage.url import parse_url

    try:
        parse_url(storage.url)
    except StorageConfigError as exc:
        p.add("storage.url", str(exc))


def check_engine(p: Problems, role: str, engine: EngineConfig, *, trains: bool) -> None:
    """Ranges of one engine section; optimizer and schedule only for engines that train."""
    for problem in engine.micro_batch.problems():
        p.add(f"{role}.micro_batch", problem)
    p.number(f"{role}.ppo_n_minibatches", engine.ppo_n_minibatches, low=1, cap=MAX_SAMPLES)
    if engine.compile_blocks_per_graph != "auto":
        p.number(f"{role}.compile_blocks_per_graph", engine.compile_blocks_per_graph, low=1)
    archon = engine.archon
    if archon.pp_stages_per_rank != "auto":
        p.number(f"{role}.archon.pp_stages_per_rank", archon.pp_stages_per_rank, low=1, cap=64)
    if archon.moe_aux_loss_coef != "auto":
        p.number(f"{role}.archon.moe_aux_loss_coef", archon.moe_aux_loss_coef, low=0)
    if engine.value_head and role != "critic":
        p.add(f"{role}.value_head", f"only the critic has a value head; set {role}.value_head=false")
    if role == "critic" and not engine.value_head:
        p.add("critic.value_head", "the critic needs a value head; set critic.value_head=true")
    lora = engine.lora
    if lora.enabled:
        p.number(f"{role}.lora.rank", lora.rank, low=1, cap=65_536)
        p.number(f"{role}.lora.alpha", lora.alpha, low=0, low_open=True)
        p.number(f"{role}.lora.dropout", lora.dropout, low=0, high=1, high_open=True)
        if lora.target_modules is not None and not lora.target_modules:
            p.add(f"{role}.lora.target_modules", "must list at least one module, or be null for the family defaults")
    if not trains:
        return
    opt = engine.optimizer
    p.number(f"{role}.optimizer.lr", opt.lr, low=0, low_open=True)
    p.number(f"{role}.optimizer.weight_decay", opt.weight_decay, low=0)
    p.number(f"{role}.optimizer.beta1", opt.beta1, low=0, high=1, high_open=True)
    p.number(f"{role}.optimizer.beta2", opt.beta2, low=0, high=1, high_open=True)
    p.number(f"{role}.optimizer.eps", opt.eps, low=0, low_open=True)
    p.number(f"{role}.optimizer.grad_clip", opt.grad_clip, low=0)
    sched = engine.lr_schedule
    p.number(f"{role}.lr_schedule.warmup_steps", sched.warmup_steps, low=0, cap=MAX_STEPS)
    p.number(f"{role}.lr_schedule.warmup_ratio", sched.warmup_ratio, low=0, high=1, high_open=True)
    p.number(f"{role}.lr_schedule.min_lr_ratio", sched.min_lr_ratio, low=0, high=1)
    if sched.warmup_steps > 0 and sched.warmup_ratio > 0:
        p.add(
            f"{role}.lr_schedule",
            "set warmup_steps or warmup_ratio, not both "
            f"(got warmup_steps={sched.warmup_steps}, warmup_ratio={sched.warmup_ratio})",
        )


def check_rollout(p: Problems, rollout: RolloutConfig) -> None:
    p.number("rollout.group_size", rollout.group_size, low=1, cap=MAX_SAMPLES)
    p.number("rollout.max_head_offpolicyness", rollout.max_head_offpolicyness, low=0, cap=MAX_STEPS)
    p.number("rollout.request_timeout_s", rollout.request_timeout_s, low=0, low_open=True)
    p.number("rollout.max_retries", rollout.max_retries, low=0, cap=MAX_RETRIES)
    p.number("rollout.max_failure_rate", rollout.max_failure_rate, low=0, high=1)
    p.number("rollout.max_concurrent_rollouts", rollout.max_concurrent_rollouts, low=1, cap=MAX_SAMPLES)
    if rollout.max_concurrent_rollouts < rollout.group_size:
        p.add(
            "rollout.max_concurrent_rollouts",
            f"must be >= rollout.group_size={rollout.group_size} "
            f"so a whole group can be in flight, got {rollout.max_concurrent_rollouts}",
        )
    s = rollout.sampling
    p.number("rollout.sampling.temperature", s.temperature, low=0)
    p.number("rollout.sampling.top_p", s.top_p, low=0, high=1, low_open=True)
    if s.top_k != -1 and s.top_k < 1:
        p.add("rollout.sampling.top_k", f"must be -1 (no limit) or >= 1, got {s.top_k}")
    p.number("rollout.sampling.max_new_tokens", s.max_new_tokens, low=1, cap=MAX_TOKENS)
    if s.seed is not None and s.seed_mode == "shared" and s.temperature > 0 and rollout.group_size > 1:
        p.add(
            "rollout.sampling.seed",
            f"a seed shared by every request makes the {rollout.group_size} samples of a "
            f"group identical (nothing for GRPO to compare); leave it null, got {s.seed}",
        )
    for i, stop in enumerate(s.stop):
        if not stop:
            p.add(f"rollout.sampling.stop[{i}]", "stop strings must be non-empty")
    for i, token in enumerate(s.stop_token_ids):
        p.number(f"rollout.sampling.stop_token_ids[{i}]", token, low=0)
    if rollout.weight_update not in WEIGHT_TRANSPORTS:
        p.add(
            "rollout.weight_update",
            f"unknown mode {rollout.weight_update!r}; {WEIGHT_TRANSPORTS.hint(rollout.weight_update)}",
        )
    srv = rollout.server
    p.non_empty("rollout.server.python", srv.python, optional=True)
    p.number("rollout.server.mem_fraction", srv.mem_fraction, low=0, high=1, low_open=True)
    p.number("rollout.server.context_length", srv.context_length, low=1, cap=MAX_TOKENS, optional=True)
    p.number("rollout.server.startup_timeout_s", srv.startup_timeout_s, low=0, low_open=True)
    p.number("rollout.server.max_restarts", srv.max_restarts, low=0, cap=MAX_RETRIES)
    for name in ("api_key_env", "admin_api_key_env"):
        value = getattr(srv, name)
        if value is not None and (not isinstance(value, str) or not ENV_NAME.fullmatch(value)):
            p.add(
                f"rollout.server.{name}",
                "must name an environment variable (letters, digits, '_'; not "
                f"starting with a digit), not hold the key itself; got a value of {len(str(value))} characters",
            )
    if srv.admin_api_key_env is not None and rollout.backend == "vllm":
        p.add(
            "rollout.server.admin_api_key_env",
            "vLLM has no admin key (its --api-key guards only the /v1 "
            "routes); leave it null and use rollout.server.api_key_env",
        )
    from areal_tasks.rollout.workflows.registry import workflow_problems

    p.items.extend(workflow_problems(rollout.workflow))  # the workflow's registry knows its names and options
    p.non_empty("rollout.reward.fn", rollout.reward.fn)
    p.number("rollout.reward.workers", rollout.reward.workers, low=0, cap=MAX_WORKERS)
    p.number("rollout.reward.timeout_s", rollout.reward.timeout_s, low=0, low_open=True)


def check_columns(p: Problems, columns: ColumnsConfig) -> None:
    """``dataset.columns``: names are non-empty; a prompt (or chat) and an answer (or tests) are named."""
    for role in ("prompt", "messages", "answer", "tests", "images"):
        p.non_empty(f"dataset.columns.{role}", getattr(columns, role), optional=True)
    metadata = columns.metadata
    names = [metadata] if isinstance(metadata, str) else metadata
    if metadata is not None and (
        not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        p.add("dataset.columns.metadata", f"must be a column name, a non-empty list of them or null, got {metadata!r}")
    if columns.prompt is None and columns.messages is None:
        p.add("dataset.columns", "name a prompt column (columns.prompt) or a chat column (columns.messages)")
    if columns.answer is None and columns.tests is None:
        p.add("dataset.columns", "name an answer column (columns.answer) or a tests column (columns.tests)")


def check_data_and_loop(
    p: Problems,
    dataset: DatasetConfig,
    train: TrainConfig,
    saver: SaverConfig,
    evaluation: EvaluationConfig,
    tracking: TrackingConfig,
) -> None:
    p.non_empty("dataset.path", dataset.path)
    p.non_empty("dataset.eval_path", dataset.eval_path, optional=True)
    p.number("dataset.max_prompt_len", dataset.max_prompt_len, low=1, cap=MAX_TOKENS)
    check_columns(p, dataset.columns)
    if dataset.streaming and isinstance(dataset.path, str) and dataset.path.startswith("demo:"):
        p.add("dataset.streaming", f"a demo set ({dataset.path}) is generated in memory; set dataset.streaming=false")
    p.number("train.batch_size", train.batch_size, low=1, cap=MAX_SAMPLES)
    p.number("train.total_steps", train.total_steps, low=1, cap=MAX_STEPS)
    p.number("train.epochs", train.epochs, low=1, cap=MAX_STEPS, optional=True)
    p.number("train.sft_lr", train.sft_lr, low=0, low_open=True, optional=True)
    if (
        p.number("train.sft_warmup_steps", train.sft_warmup_steps, low=0, cap=MAX_STEPS)
        and train.sft_warmup_steps >= train.total_steps
    ):
        p.add(
            "train.sft_warmup_steps",
            f"must be < train.total_steps={train.total_steps} or no RL step would run, got {train.sft_warmup_steps}",
        )
    p.number("saver.freq_steps", saver.freq_steps, low=1, cap=MAX_STEPS, optional=True)
    p.number("saver.keep_last", saver.keep_last, low=1, cap=MAX_STEPS)
    p.number("saver.keep_every", saver.keep_every, low=1, cap=MAX_STEPS, optional=True)
    p.non_empty("saver.keep_best_metric", saver.keep_best_metric, optional=True)
    p.number("evaluation.freq_steps", evaluation.freq_steps, low=1, cap=MAX_STEPS, optional=True)
    p.number("evaluation.n_samples", evaluation.n_samples, low=1, cap=MAX_SAMPLES)
    p.number("evaluation.max_eval_prompts", evaluation.max_eval_prompts, low=1, cap=MAX_SAMPLES, optional=True)
    p.number("evaluation.temperature", evaluation.temperature, low=0)
    if evaluation.freq_steps is not None and dataset.eval_path is None:
        p.add(
            "evaluation.freq_steps",
            "periodic evaluation needs an eval set: set dataset.eval_path, or evaluation.freq_steps=null",
        )
    p.number("tracking.log_every", tracking.log_every, low=1, cap=MAX_STEPS)
    p.non_empty("tracking.mlflow_uri", tracking.mlflow_uri, optional=True)
    p.non_empty("tracking.mlflow_experiment", tracking.mlflow_experiment, optional=True)
