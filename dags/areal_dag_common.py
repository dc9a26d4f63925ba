"""Shared pieces of the areal-tasks DAGs: paths, retry/timeout defaults, failure logging, Params.

Not a DAG file (``.airflowignore`` keeps the DAG processor from parsing it on its own); the DAG
files import it by name, as Airflow puts the DAG folder (the bundle path) on ``sys.path``.

At module level only the standard library, ``airflow.sdk`` and the torch-free registries of
``areal_tasks`` that the Params' choices are derived from (the algorithm configs, the scheduler
registry): DAG files parse fast and never import torch (``tests/unit/dags`` checks it).

Settings read from the environment when a DAG file is parsed:

* ``AREAL_PROJECT_DIR``: the checkout holding ``configs/`` (default: the folder above ``dags/``);
  relative ``config`` Params are resolved against it;
* ``AREAL_RUNS_DIR``: where a DAG run's run directory goes when the ``run_dir`` Param is empty
  (default ``<project>/runs``): ``<runs>/<dag_id>/<run_id>``;
* ``AREAL_DAG_RETRIES`` (default 2) and ``AREAL_DAG_RETRY_DELAY_S`` (default 60): retries of every
  task, with exponential backoff (x2 per try) capped at ``AREAL_DAG_MAX_RETRY_DELAY_S`` (600);
* ``AREAL_TRAIN_TIMEOUT_H`` (default 72): the training task's execution timeout;
* ``AREAL_JOB_POLL_INTERVAL_S`` (default 10): how often the training task looks at its job.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Param

from areal_tasks.config.algorithm import AlgorithmConfig
from areal_tasks.launch.registry import scheduler_kinds

logger = logging.getLogger("areal.dags")

DAGS_DIR = Path(__file__).resolve().parent
#: the owner shown in the UI.
OWNER = "areal"
#: the registered model name when the Param is left at its default.
DEFAULT_MODEL_NAME = "areal-policy"
#: the metric the registry gates the champion alias on.
DEFAULT_GATE_METRIC = "eval/reward"
#: the ``algorithm`` Param's choices: every registered algorithm config.
ALGORITHMS: list[str] = AlgorithmConfig.names()
#: the ``scheduler`` Param's choices: the built scheduler kinds (planned ones are not offered).
SCHEDULERS: list[str] = list(scheduler_kinds())


def _env_number(name: str, default: float, *, minimum: float = 0) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name}={raw!r}: expected a number (e.g. {default:g})") from None
    if value < minimum:
        raise ValueError(f"${name}={raw!r}: must be at least {minimum:g}")
    return value


def project_dir() -> Path:
    """The checkout holding ``configs/``: ``$AREAL_PROJECT_DIR`` or the folder above ``dags/``."""
    return Path(os.environ.get("AREAL_PROJECT_DIR") or DAGS_DIR.parent).resolve()


def runs_dir() -> Path:
    """Where run directories go by default: ``$AREAL_RUNS_DIR`` or ``<project>/runs``."""
    return Path(os.environ.get("AREAL_RUNS_DIR") or project_dir() / "runs").resolve()


def resolve_config_path(config: str) -> str:
    """``config`` as an absolute path (relative ones are under the project directory); must exist."""
    path = Path(config).expanduser()
    if not path.is_absolute():
        path = project_dir() / path
    if not path.is_file():
        raise FileNotFoundError(
            f"Param config={config!r}: no such file {path}; give a path relative to {project_dir()} "
            "(e.g. configs/demo_grpo.yaml) or an absolute one ($AREAL_PROJECT_DIR sets the project directory)"
        )
    return str(path)


def default_run_dir(dag_id: str, run_id: str) -> str:
    """``<runs>/<dag_id>/<run_id>`` with the run id made filesystem-safe."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("_") or "run"
    return str(runs_dir() / dag_id / safe)


def retry_settings() -> dict[str, Any]:
    """Retries with exponential backoff, from ``$AREAL_DAG_RETRIES`` and ``$AREAL_DAG_RETRY_DELAY_S``."""
    return {
        "retries": int(_env_number("AREAL_DAG_RETRIES", 2)),
        "retry_delay": timedelta(seconds=_env_number("AREAL_DAG_RETRY_DELAY_S", 60)),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(seconds=_env_number("AREAL_DAG_MAX_RETRY_DELAY_S", 600)),
    }


def train_timeout() -> timedelta:
    """The training task's execution timeout (``$AREAL_TRAIN_TIMEOUT_H``, default 72 h)."""
    return timedelta(hours=_env_number("AREAL_TRAIN_TIMEOUT_H", 72, minimum=0.01))


def job_poll_interval() -> float:
    """Seconds between two looks of the training task at its job (``$AREAL_JOB_POLL_INTERVAL_S``,
    default 10): a finished job is noticed at most this late."""
    return _env_number("AREAL_JOB_POLL_INTERVAL_S", 10, minimum=0.1)


def default_args() -> dict[str, Any]:
    """Every task: the owner, retries with backoff, a 30-minute timeout (long tasks set their own),
    and callbacks that log a clear summary on a retry and on a final failure."""
    return {
        "owner": OWNER,
        **retry_settings(),
        "execution_timeout": timedelta(minutes=30),
        "on_retry_callback": log_task_retry,
        "on_failure_callback": log_task_failure,
    }


# ---------------------------------------------------------------------------- failure callbacks


def _describe_exception(exc: BaseException | str | None) -> str:
    if exc is None:
        return "unknown (see the task log)"
    if isinstance(exc, BaseException):
        text = str(exc).strip() or "(no message)"
        return f"{type(exc).__name__}: {text}"
    return str(exc)


def failure_summary(context: Mapping[str, Any], *, final: bool) -> str:
    """The lines a retry or a final failure logs: what failed, why, what happens next, where to look."""
    ti = context.get("ti") or context.get("task_instance")
    task_id = getattr(ti, "task_id", "?")
    map_index = getattr(ti, "map_index", -1)
    if map_index is not None and map_index >= 0:
        task_id = f"{task_id}[{map_index}]"
    try_number = getattr(ti, "try_number", None)
    max_tries = getattr(ti, "max_tries", None)
    attempts = f"try {try_number} of {max_tries + 1}" if try_number and max_tries is not None else "try ?"
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
    run_id = getattr(ti, "run_id", None) or context.get("run_id", "?")
    task = context.get("task")
    if final:
        next_step = "no retries left: the DAG run fails; fix the cause and clear the task (or trigger a new run)"
    else:
        delay = getattr(task, "retry_delay", None)
        backoff = getattr(task, "retry_exponential_backoff", 0)
        when = f"in about {delay}" + (f" x{backoff:g} per earlier retry" if backoff else "") if delay else "soon"
        next_step = f"retrying {when}"
        if task_id.startswith("train"):
            next_step += " (the retry reattaches to a running job or resumes it from its last checkpoint)"
    lines = [
        f"AREAL {'TASK FAILED' if final else 'TASK WILL RETRY'}: {dag_id}.{task_id} ({attempts}), run {run_id}",
        f"  error: {_describe_exception(context.get('exception'))}",
        f"  next:  {next_step}",
    ]
    params = context.get("params") or {}
    shown = {
        k: params[k]
        for k in ("config", "model", "dataset", "algorithm", "storage_url", "checkpoint_url")
        if k in params and params[k] not in (None, "")
    }
    if shown:
        lines.append("  params: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    log_url = getattr(ti, "log_url", None)
    if log_url:
        lines.append(f"  log:   {log_url}")
    return "\n".join(lines)


def log_task_retry(context: Mapping[str, Any]) -> None:
    """``on_retry_callback``: one warning block saying what failed and that it will be retried."""
    logger.warning("%s", failure_summary(context, final=False))


def log_task_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback``: one error block saying what failed for good and what to do."""
    logger.error("%s", failure_summary(context, final=True))


def common_dag_kwargs() -> dict[str, Any]:
    """What every areal DAG shares: a fixed start date without catch-up, the task defaults of
    :func:`default_args` (retries with backoff, timeouts, callbacks) and the DAG-level failure log."""
    return {
        "start_date": datetime(2025, 1, 1),
        "catchup": False,
        "default_args": default_args(),
        "on_failure_callback": log_dag_failure,
    }


def log_dag_failure(context: Mapping[str, Any]) -> None:
    """DAG-level ``on_failure_callback``: one line naming the run and the reason Airflow gives."""
    dag_run = context.get("dag_run")
    dag_id = getattr(dag_run, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
    run_id = getattr(dag_run, "run_id", None) or context.get("run_id", "?")
    logger.error(
        "AREAL DAG RUN FAILED: %s run %s (%s); the failed task's log starts its error with 'AREAL TASK FAILED'",
        dag_id,
        run_id,
        context.get("reason") or "a task failed",
    )


# ---------------------------------------------------------------------------- Params


def _optional(kind: str) -> list[str]:
    return ["null", kind]


def tracking_params() -> dict[str, Param]:
    """Params of the MLflow tracking and registry shared by the DAGs."""
    return {
        "mlflow_tracking_uri": Param(
            None,
            type=_optional("string"),
            title="MLflow tracking URI",
            description="Empty: the Airflow connection 'areal_mlflow' (its host), else $MLFLOW_TRACKING_URI. "
            "E.g. http://mlflow:5000 or sqlite:////data/mlflow.db.",
            section="Tracking and registry",
        ),
        "registered_model_name": Param(
            DEFAULT_MODEL_NAME,
            type="string",
            minLength=1,
            maxLength=200,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
            title="Registered model name",
            description="MLflow registry name; each evaluated checkpoint becomes a version with alias 'candidate', "
            "and 'champion' when it beats the current champion's gate metric.",
            section="Tracking and registry",
        ),
        "gate_metric": Param(
            DEFAULT_GATE_METRIC,
            type="string",
            minLength=1,
            title="Gate metric",
            description="Evaluation metric (higher is better) a candidate must beat to become champion: "
            "eval/reward, eval/accuracy, eval/answer_rate, eval/pass@1, eval/pass@K, eval/maj@K (K = samples "
            "per prompt), or eval/<set>/<metric> for one of several eval sets (docs/evaluation.md).",
            section="Tracking and registry",
        ),
    }


#: the recipes the Job config Param proposes (the Airflow form offers them; any other path is accepted).
EXAMPLE_CONFIGS = (
    "configs/demo_grpo.yaml",
    "configs/agent_arealopenai.yaml",
    "configs/agent_openai_sdk.yaml",
    "configs/agent_openai_agents.yaml",
    "configs/demo_agent_calculator.yaml",
    "configs/demo_vision_grpo.yaml",
)


def job_params(*, config_default: str = "configs/demo_grpo.yaml") -> dict[str, Param]:
    """Params that shape a training job. Empty (null) values keep what the config file says."""
    return {
        "config": Param(
            config_default,
            type="string",
            minLength=1,
            title="Job config",
            description="YAML recipe, relative to the project directory (e.g. configs/demo_grpo.yaml) or absolute. "
            "Every field below overrides it; leave a field empty to keep the recipe's value. The proposals "
            "include the agent examples (docs/agents.md): agent_arealopenai (in-process agent code), "
            "agent_openai_sdk and agent_openai_agents (unmodified SDK programs behind the agent proxy).",
            examples=list(EXAMPLE_CONFIGS),
            section="Job",
        ),
        "model": Param(
            None,
            type=_optional("string"),
            title="Model",
            description="HF hub id, local HF directory, or tiny:<family>?key=value (the built-in tiny-model kit).",
            section="Job",
        ),
        "dataset": Param(
            None,
            type=_optional("string"),
            title="Dataset",
            description="demo:<name>?options, a local file or directory, or a hub dataset id.",
            section="Job",
        ),
        "algorithm": Param(
            None,
            type=_optional("string"),
            enum=[None, *ALGORITHMS],
            title="Algorithm",
            description="RL algorithm (docs/algorithms.md). ppo needs a critic in the config.",
            section="Job",
        ),
        "allocation_mode": Param(
            None,
            type=_optional("string"),
            maxLength=200,
            title="Allocation mode",
            description="Inference + training layout, e.g. embedded:d1+fsdp:d2 or sglang:d2+fsdp:d4 "
            "(docs/allocation.md).",
            section="Job",
        ),
        "experiment_name": Param(
            None,
            type=_optional("string"),
            maxLength=100,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
            title="Experiment name",
            description="experiment.name: groups runs; also the MLflow experiment.",
            section="Job",
        ),
        "max_steps": Param(
            None,
            type=_optional("integer"),
            minimum=1,
            maximum=1_000_000,
            title="Max steps",
            description="train.total_steps: SFT warm-start steps plus RL steps.",
            section="Job",
        ),
        "sft_steps": Param(
            None,
            type=_optional("integer"),
            minimum=0,
            maximum=1_000_000,
            title="SFT warm-start steps",
            description="train.sft_warmup_steps (0 = no warm start); must be below Max steps.",
            section="Job",
        ),
        "eval_prompts": Param(
            None,
            type=_optional("integer"),
            minimum=1,
            maximum=100_000,
            title="Eval prompts",
            description="evaluation.max_eval_prompts: eval-split prompts used before/after RL and for each "
            "checkpoint's evaluation (empty = the whole eval split).",
            section="Job",
        ),
        "eval_sets": Param(
            [],
            type="array",
            items={"type": "string", "minLength": 1},
            maxItems=20,
            title="Eval sets",
            description="Sets each checkpoint is evaluated on, one per line: a .jsonl of {prompt, answer} objects, "
            "demo:<task>, or another dataset URL; NAME=URL names a set (its metrics are logged as "
            "eval/<NAME>/<metric>). Empty: the config's eval split. See docs/evaluation.md.",
            section="Job",
        ),
        "extra_overrides": Param(
            [],
            type="array",
            items={"type": "string", "pattern": r"^[A-Za-z_][\w.]*=.*$"},
            maxItems=100,
            title="Extra overrides",
            description="More dotted key=value overrides, one per line, applied last (e.g. actor.optimizer.lr=1e-5).",
            section="Job",
        ),
        "storage_url": Param(
            None,
            type=_optional("string"),
            title="Storage URL",
            description="Where checkpoints go: a path, file://..., or s3://bucket/prefix. "
            "Empty: file://<run dir>/storage.",
            section="Storage and cluster",
        ),
        "run_dir": Param(
            None,
            type=_optional("string"),
            title="Run directory",
            description="Local directory for the job's logs, metrics and summary. "
            "Empty: <runs>/<dag id>/<run id> (retries of this DAG run reuse it and resume).",
            section="Storage and cluster",
        ),
        "scheduler": Param(
            "local",
            type="string",
            enum=SCHEDULERS,
            title="Cluster scheduler",
            description="Where the job runs: a built scheduler kind (areal_tasks/launch/registry.py); 'local' runs "
            "the job's processes on the Airflow worker.",
            section="Storage and cluster",
        ),
        "nodes": Param(
            None,
            type=_optional("integer"),
            minimum=1,
            maximum=100000,
            title="Nodes",
            description="Nodes the job runs on (cluster.nodes); more than one needs the ray or slurm scheduler, a "
            "shared run directory and shared storage. Empty: the config's.",
            section="Storage and cluster",
        ),
        "cluster_conn_id": Param(
            None,
            type=_optional("string"),
            title="Cluster connection",
            description="The Airflow connection of the cluster (ray: areal_ray, slurm: areal_slurm when empty; "
            "local takes none). docs/clusters.md lists its fields.",
            section="Storage and cluster",
        ),
        "n_gpus": Param(
            0,
            type="integer",
            minimum=0,
            maximum=4096,
            title="GPUs",
            description="GPUs the job may use (0 = CPU). Used for the layout recommendation and the resource check.",
            section="Storage and cluster",
        ),
    }


def evaluate_param() -> Param:
    """Which checkpoints of the training job the DAG evaluates (and registers the best of)."""
    return Param(
        "final",
        type="string",
        enum=["final", "all"],
        title="Checkpoints to evaluate",
        values_display={"final": "the final checkpoint", "all": "every checkpoint the job kept"},
        description="Each evaluation starts one inference server on the checkpoint and scores the eval split; "
        "the best evaluated checkpoint is registered.",
        section="Job",
    )


#: Param name -> the config key it overrides.
OVERRIDE_KEYS: dict[str, str] = {
    "model": "model.path",
    "dataset": "dataset.path",
    "algorithm": "algorithm.name",
    "allocation_mode": "allocation",
    "experiment_name": "experiment.name",
    "max_steps": "train.total_steps",
    "sft_steps": "train.sft_warmup_steps",
    "eval_prompts": "evaluation.max_eval_prompts",
    "storage_url": "storage.url",
    "scheduler": "cluster.scheduler",
    "nodes": "cluster.nodes",
}


def job_overrides(params: Mapping[str, Any]) -> list[str]:
    """The dotted overrides the Params ask for: set fields in OVERRIDE_KEYS order, then ``extra_overrides``."""
    out = [f"{key}={params[name]}" for name, key in OVERRIDE_KEYS.items() if params.get(name) not in (None, "")]
    for item in params.get("extra_overrides") or []:
        if "=" not in str(item):
            raise ValueError(f"Param extra_overrides: {item!r} is not a dotted key=value override")
        out.append(str(item))
    return out
