"""The task graph the areal-tasks DAGs share (:func:`training_pipeline`) and its small Python tasks:
resolve the job, open and close the MLflow run, pick the checkpoints to evaluate, write the summary
and the run report (logged to the MLflow run with the traces).

Like ``areal_dag_common`` this is a helper module, not a DAG file (``.airflowignore``). The heavy
lifting is in ``operators/``; these tasks only move values between them. Everything beyond the
standard library and ``airflow.sdk`` is imported inside the task bodies, so parsing stays fast and
torch-free: ``areal_tasks.config`` (torch-free) to resolve and validate the job, the MLflow hook to
open and close the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import TriggerRule, XComArg, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException
from areal_dag_common import default_run_dir, job_overrides, job_poll_interval, resolve_config_path, train_timeout

from areal_tasks.api.run_dir import RunPaths
from operators.operators.cluster import ProvisionClusterOperator
from operators.operators.evaluation import EvaluateCheckpointOperator
from operators.operators.model import DetectModelOperator
from operators.operators.registry import RegisterModelOperator
from operators.operators.storage import ValidateStorageOperator
from operators.operators.training import AReaLTrainingOperator

logger = logging.getLogger("areal.dags")


@task(multiple_outputs=True, retries=0, execution_timeout=timedelta(minutes=2))
def resolve_job(overrides_from: str | None = None) -> dict[str, Any]:
    """Load the config with the Params as overrides, validate it, write ``<run dir>/config.yaml``.

    ``overrides_from`` names an upstream task whose ``overrides`` XCom (a list) is applied after the
    Params (the retraining DAG uses it to start from the champion). A config with problems fails
    the task at once, without retries: every problem is listed in the error.

    Secrets stay out of XCom, the log and the error: ``config.yaml`` and the ``overrides`` and
    ``storage_options`` XComs are redacted (``***``). The job's secrets come from the Airflow
    workers' environment (``$AREAL_CONFIG_SECRETS``, ``AWS_*``), which every task of the pipeline
    sees; an override that carries a secret is refused, because Params are stored in the Airflow
    database and shown in its UI, and the redacted ``config.yaml`` the training task reads would
    not hold it.
    """
    from areal_tasks.config import load_config, write_resolved
    from areal_tasks.config.secrets import SECRETS_ENV, split_secret_overrides
    from areal_tasks.errors import ConfigError
    from storage.redact import redact_argv, redact_mapping, redact_text, redact_url

    context = get_current_context()
    params = context["params"]
    dag_id, run_id = context["dag"].dag_id, context["run_id"]
    try:
        config = resolve_config_path(params["config"])
        run_dir = params.get("run_dir") or default_run_dir(dag_id, run_id)
        run_dir = str(Path(run_dir).expanduser().resolve())
        overrides = job_overrides(params)
    except (FileNotFoundError, ValueError) as exc:
        raise AirflowFailException(redact_text(str(exc))) from exc
    if overrides_from:
        extra = context["ti"].xcom_pull(task_ids=overrides_from, key="overrides") or []
        overrides += list(extra)
    _, secret = split_secret_overrides(overrides)
    if secret:
        raise AirflowFailException(
            f"the overrides {redact_argv(secret)} carry secrets. Params are stored in the Airflow database and "
            "shown in its UI, so they are no place for one: set it in the Airflow workers' environment instead, "
            f'as ${SECRETS_ENV} (JSON, e.g. {{"storage.options.secret": "..."}}) or the AWS_* variables, '
            "and trigger again without it."
        )
    overrides.append(f"experiment.run_dir={run_dir}")
    try:
        cfg = load_config(config, overrides)
        resolved = write_resolved(cfg)
    except ConfigError as exc:
        raise AirflowFailException(
            f"the job config is invalid: {config} with overrides {redact_argv(overrides)}:\n{redact_text(str(exc))}\n"
            "Fix the Params (or the config file) and trigger again."
        ) from exc
    storage_url = redact_url(cfg.storage.url or "")
    logger.info(
        "job: %s + %s -> %s (run dir %s, storage %s)", config, redact_argv(overrides), resolved, run_dir, storage_url
    )
    return {
        "config": config,
        "overrides": redact_argv(overrides),
        "resolved_config": str(resolved),
        "run_dir": run_dir,
        "storage_url": storage_url,
        "storage_options": redact_mapping(cfg.storage.options),
        "model": cfg.model.path,
        "allocation": cfg.allocation,
        "scheduler": cfg.cluster.scheduler,
        "nodes": cfg.cluster.nodes,
        "conn_id": params.get("cluster_conn_id") or None,
        "n_gpus": int(params.get("n_gpus") or 0),
        "experiment": cfg.tracking.mlflow_experiment or cfg.experiment.name,
        "trial": cfg.experiment.trial,
        "algorithm": cfg.algorithm.name,
        "dataset": cfg.dataset.path,
        "eval_sets": [str(item) for item in params.get("eval_sets") or []],
    }


def _mlflow_hook(uri: str | None) -> Any:
    from operators.hooks.mlflow import MlflowHook

    return MlflowHook(tracking_uri=uri or None)


@task(multiple_outputs=True, execution_timeout=timedelta(minutes=5))
def start_mlflow_run(job: Mapping[str, Any]) -> dict[str, Any]:
    """Create the MLflow run this DAG run logs into (the training job's callback attaches to it)."""
    context = get_current_context()
    params = context["params"]
    hook = _mlflow_hook(params.get("mlflow_tracking_uri"))
    tags = {
        "airflow.dag_id": context["dag"].dag_id,
        "airflow.run_id": context["run_id"],
        "areal.run_dir": job["run_dir"],
        "areal.config": job["config"],
    }
    run_id = hook.start_run(
        job["experiment"],
        run_name=f"{job['trial']} {context['run_id']}",
        tags=tags,
    )
    pipeline_params = {f"airflow.{key}": value for key, value in params.items() if value not in (None, "", [])}
    hook.log_params(run_id, {key: json.dumps(v) if not isinstance(v, str) else v for key, v in pipeline_params.items()})
    uri = hook.shown_uri  # XCom and the log get it redacted; the hooks downstream resolve the real one
    logger.info("MLflow run %s in experiment %s at %s", run_id, job["experiment"], uri)
    return {"mlflow_run_id": run_id, "tracking_uri": uri}


@task
def checkpoints_to_evaluate(train_result: Mapping[str, Any]) -> list[str]:
    """The final checkpoint, or (Param ``evaluate=all``) every checkpoint the job kept, oldest first."""
    params = get_current_context()["params"]
    final = train_result.get("final_checkpoint")
    if params.get("evaluate") == "all":
        chosen = [str(url) for url in train_result.get("checkpoints") or []]
        if final and final not in chosen:
            chosen.append(final)
    else:
        chosen = [final] if final else []
    if not chosen:
        raise AirflowFailException(
            f"the training job {train_result.get('job_name')} reported no checkpoint "
            f"(run dir {train_result.get('run_dir')}); set saver.freq_steps or check the job's log"
        )
    return chosen


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    from storage.atomic import write_local_text

    write_local_text(path, json.dumps(dict(data), indent=2, default=str))


def format_pipeline_summary(summary: Mapping[str, Any]) -> str:
    """A few lines for the log: the rewards, the checkpoint, the MLflow run, the registered version."""

    def number(key: str) -> str:
        value = summary.get(key)
        return f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"

    lines = [
        f"eval reward before RL -> after RL: {number('reward_before')} -> {number('reward_after')}",
        f"checkpoint:       {summary.get('checkpoint')}",
        f"MLflow run:       {summary.get('mlflow_run_id')} ({summary.get('mlflow_tracking_uri')})",
        f"registered model: {summary.get('registered_model_name')} version {summary.get('registered_model_version')} "
        f"aliases {summary.get('registered_model_aliases')}",
    ]
    for evaluation in summary.get("evaluations") or []:
        metrics = evaluation.get("metrics") or {}
        shown = ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items()) if isinstance(v, (int, float)))
        lines.append(f"evaluation of {evaluation.get('checkpoint')}: {shown}")
    if summary.get("report"):
        lines.append(f"run report:       {Path(summary['report']).resolve().as_uri()} (open it in a browser)")
        files = ", ".join(summary.get("report_files") or [])
        lines.append(f"MLflow artifacts: {summary.get('report_artifacts')} ({files})")
        if "trace.json" in (summary.get("report_files") or []):
            trace = Path(summary["report"]).with_name("trace.json")
            lines.append(f"perf trace:       {trace}: open it in https://ui.perfetto.dev (Open trace file)")
    return "\n".join(lines)


#: the MLflow run's artifact folder of the run report and the traces it points at.
REPORT_ARTIFACT_DIR = "report"


def publish_run_report(run_dir: str, hook: Any, run_id: str) -> dict[str, Any]:
    """Write ``<run_dir>/report.html`` and log it, with ``trace.json`` and ``sessions.jsonl`` when the
    run has them, as artifacts under ``report/`` of the MLflow run ``run_id`` (through ``hook``, an
    MlflowHook). Returns ``{"report", "report_artifacts", "report_files"}`` for the summary."""
    from areal_tasks.report import SESSIONS_FILE, TRACE_FILE, write_report
    from storage.redact import redact_url

    report = write_report(run_dir)
    files = [
        report,
        *(path for path in (report.with_name(TRACE_FILE), report.with_name(SESSIONS_FILE)) if path.is_file()),
    ]
    uri = hook.log_artifacts(run_id, files, REPORT_ARTIFACT_DIR)
    return {"report": str(report), "report_artifacts": redact_url(uri), "report_files": [path.name for path in files]}


@task(execution_timeout=timedelta(minutes=5))
def finish_pipeline(
    job: Mapping[str, Any],
    mlflow: Mapping[str, Any],
    train_result: Mapping[str, Any],
    evaluations: Sequence[Mapping[str, Any]],
    registered: Mapping[str, Any],
) -> dict[str, Any]:
    """Add the pipeline's figures to ``<run dir>/summary.json``, write the run report and log it (with
    the traces) to the MLflow run (:func:`publish_run_report`), end the run FINISHED; the log ends with
    where to open the report and the trace."""
    context = get_current_context()
    params = context["params"]
    # by index: iterating a mapped task's lazy output probes one past the end (Airflow logs an error)
    evaluations = [dict(evaluations[i]) for i in range(len(evaluations))]
    summary = {
        "reward_before": train_result.get("reward_before"),
        "reward_after": train_result.get("reward_after"),
        "checkpoint": registered.get("checkpoint") or train_result.get("final_checkpoint"),
        "checkpoints": list(train_result.get("checkpoints") or []),
        "mlflow_run_id": mlflow["mlflow_run_id"],
        "mlflow_tracking_uri": mlflow["tracking_uri"],
        "registered_model_name": params.get("registered_model_name"),
        "registered_model_version": registered.get("version"),
        "registered_model_aliases": list(registered.get("aliases") or []),
        "champion_changed": registered.get("champion_changed"),
        "evaluations": evaluations,
        "airflow_dag_id": context["dag"].dag_id,
        "airflow_run_id": context["run_id"],
        "job_name": train_result.get("job_name"),
    }
    path = RunPaths.of(job["run_dir"]).summary  # the pipeline's figures go next to the trainer's
    trainer_summary: dict[str, Any] = dict(train_result.get("summary") or {})
    if path.is_file():
        trainer_summary = {**trainer_summary, **json.loads(path.read_text(encoding="utf-8"))}
    merged = {**trainer_summary, **summary}
    _write_json_atomic(path, merged)  # first, so that the report shows the pipeline's figures
    hook = _mlflow_hook(mlflow["tracking_uri"])
    report = publish_run_report(job["run_dir"], hook, mlflow["mlflow_run_id"])
    summary.update(report)
    merged.update(report)
    _write_json_atomic(path, merged)
    hook.end_run(mlflow["mlflow_run_id"], status="FINISHED")
    logger.info("pipeline summary (also in %s):\n%s", path, format_pipeline_summary(merged))
    return summary


@task(trigger_rule=TriggerRule.ONE_FAILED, execution_timeout=timedelta(minutes=5))
def fail_mlflow_run() -> None:
    """When a task after ``start_mlflow_run`` failed: end the MLflow run FAILED, naming the failed tasks."""
    context = get_current_context()
    ti = context["ti"]
    mlflow = ti.xcom_pull(task_ids="start_mlflow_run") or {}
    run_id = mlflow.get("mlflow_run_id")
    if not run_id:
        logger.info("no MLflow run was started for this DAG run: nothing to end")
        return
    _mlflow_hook(mlflow.get("tracking_uri")).end_run(run_id, status="FAILED")
    logger.warning("MLflow run %s ended FAILED (a task of DAG run %s failed)", run_id, context["run_id"])


@task(trigger_rule=TriggerRule.ONE_FAILED, retries=0, execution_timeout=timedelta(minutes=1))
def pipeline_failed() -> None:
    """Leaf that fails the DAG run when any task of it failed.

    Airflow derives a run's state from its leaf tasks. The clean-up task ``fail_mlflow_run`` runs
    (and succeeds) exactly when something failed, so without this leaf a failed pipeline would end
    as a green run, and sensors or schedules downstream would take it as done. Skipped when nothing
    failed."""
    context = get_current_context()
    raise AirflowFailException(
        f"DAG run {context['run_id']} failed: a task of it failed (see the task marked failed; its "
        "downstream tasks are upstream_failed). fail_mlflow_run ended the MLflow run FAILED."
    )


def fail_run_on_any_failure(tasks: Sequence[Any]) -> Any:
    """Put :func:`pipeline_failed` downstream of every task in ``tasks``; returns it.

    Pass the pipeline's tasks, not the ONE_FAILED clean-up: it only runs when one of them failed
    (which already fires the watcher), and a watcher downstream of it would be decided one
    scheduling round later, which ``airflow dags test`` reports as "unrunnable tasks"."""
    watcher = pipeline_failed()
    for upstream in tasks:
        upstream >> watcher
    return watcher


def training_pipeline(job: XComArg) -> dict[str, Any]:
    """Wire pre-flight checks -> MLflow run -> training -> evaluation -> registry into the current DAG.

    ``job`` is the output of :func:`resolve_job`. Returns the tasks by name (for the DAG files that
    add more around them).
    """
    storage = ValidateStorageOperator(
        task_id="validate_storage",
        storage_url=job["storage_url"],
        options=job["storage_options"],
        execution_timeout=timedelta(minutes=5),
    )
    model = DetectModelOperator(
        task_id="detect_model", model=job["model"], n_gpus=job["n_gpus"], execution_timeout=timedelta(minutes=15)
    )
    cluster = ProvisionClusterOperator(
        task_id="provision_cluster",
        scheduler=job["scheduler"],
        conn_id=job["conn_id"],
        nodes=job["nodes"],
        allocation_mode=job["allocation"],
        n_gpus=job["n_gpus"],
        execution_timeout=timedelta(minutes=30),
    )
    mlflow = start_mlflow_run(job)
    train = AReaLTrainingOperator(
        task_id="train",
        config=job["resolved_config"],
        run_dir=job["run_dir"],
        scheduler=job["scheduler"],
        conn_id=job["conn_id"],
        mlflow_run_id=mlflow["mlflow_run_id"],
        mlflow_tracking_uri=mlflow["tracking_uri"],
        execution_timeout=train_timeout(),
        poll_interval=job_poll_interval(),
    )
    evaluate = EvaluateCheckpointOperator.partial(
        task_id="evaluate_checkpoint",
        config=job["resolved_config"],
        eval_sets=job["eval_sets"],
        mlflow_run_id=mlflow["mlflow_run_id"],
        mlflow_tracking_uri=mlflow["tracking_uri"],
        execution_timeout=timedelta(hours=2),
    ).expand(checkpoint=checkpoints_to_evaluate(train.output))
    register = RegisterModelOperator(
        task_id="register_model",
        evaluations=evaluate.output,
        model_name="{{ params.registered_model_name }}",
        gate_metric="{{ params.gate_metric }}",
        mlflow_run_id=mlflow["mlflow_run_id"],
        mlflow_tracking_uri=mlflow["tracking_uri"],
        execution_timeout=timedelta(minutes=10),
    )
    finish = finish_pipeline(job, mlflow, train.output, evaluate.output, register.output)
    cleanup = fail_mlflow_run()
    job >> storage >> model >> cluster >> mlflow
    [train, evaluate, register, finish] >> cleanup
    watcher = fail_run_on_any_failure([job, storage, model, cluster, mlflow, train, evaluate, register, finish])
    return {
        "validate_storage": storage,
        "detect_model": model,
        "provision_cluster": cluster,
        "start_mlflow_run": mlflow,
        "train": train,
        "evaluate_checkpoint": evaluate,
        "register_model": register,
        "finish": finish,
        "fail_mlflow_run": cleanup,
        "pipeline_failed": watcher,
    }


@task(execution_timeout=timedelta(minutes=10))
def finish_evaluation(mlflow: Mapping[str, Any], evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """End the evaluation's MLflow run FINISHED; log and return the metrics (and the registered version)."""
    context = get_current_context()
    registered = context["ti"].xcom_pull(task_ids="register_model") or {}
    summary = {
        "checkpoint": evaluation.get("checkpoint"),
        "evaluations": [dict(evaluation)],
        "mlflow_run_id": mlflow["mlflow_run_id"],
        "mlflow_tracking_uri": mlflow["tracking_uri"],
        "registered_model_name": context["params"].get("registered_model_name") if registered else None,
        "registered_model_version": registered.get("version"),
        "registered_model_aliases": list(registered.get("aliases") or []),
    }
    _mlflow_hook(mlflow["tracking_uri"]).end_run(mlflow["mlflow_run_id"], status="FINISHED")
    logger.info("evaluation summary:\n%s", format_pipeline_summary(summary))
    return summary


def _latest_asset_extra(context: Mapping[str, Any], asset_name: str) -> dict[str, Any]:
    """The ``extra`` of the newest triggering event of the Asset ``asset_name`` (empty when none)."""
    events = context.get("triggering_asset_events") or {}
    found = [event for asset, batch in events.items() if getattr(asset, "name", None) == asset_name for event in batch]
    if not found:
        return {}
    return dict(max(found, key=lambda event: event.timestamp).extra or {})


def asset_event_dataset(extra: Mapping[str, Any]) -> str | None:
    """The ``dataset.path`` an Asset event's ``extra`` names: ``extra.dataset`` (an event posted by a
    producer or the REST API), else ``extra.payload.dataset`` (an event from the data-landing
    watcher: Airflow stores a trigger's event as ``{"from_trigger": true, "payload": ...}``)."""
    payload = extra.get("payload")
    found = extra.get("dataset") or (payload.get("dataset") if isinstance(payload, Mapping) else None)
    return str(found) if found else None


def _export_champion(checkpoint_url: str, out_dir: Path) -> Path:
    """An HF model directory of ``checkpoint_url`` (reused when already exported), by ``areal checkpoint export``."""
    import subprocess
    import sys

    if (out_dir / "config.json").is_file():
        logger.info("champion already exported in %s", out_dir)
        return out_dir
    command = [sys.executable, "-m", "areal_tasks.cli", "checkpoint", "export", checkpoint_url, "--hf", str(out_dir)]
    logger.info("exporting the champion checkpoint: %s", " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"could not export the champion checkpoint {checkpoint_url} to {out_dir} "
            f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return out_dir


@task(multiple_outputs=True, execution_timeout=timedelta(minutes=40))
def start_from_champion(asset_name: str) -> dict[str, Any]:
    """Overrides that start the job from the registry's champion (and the new data an Asset event names)."""
    from areal_dag_common import runs_dir

    context = get_current_context()
    params = context["params"]
    name = params["registered_model_name"]
    champion = _mlflow_hook(params.get("mlflow_tracking_uri")).get_champion(name)
    overrides: list[str] = []
    if champion:
        version = champion.get("version")
        model_dir = (champion.get("tags") or {}).get("areal.model_dir")  # the HF export it was evaluated from
        if not model_dir or not Path(model_dir, "config.json").is_file():
            url = champion.get("checkpoint_url") or champion.get("checkpoint")
            if not url:
                raise AirflowFailException(f"the champion of {name!r} (version {version}) names no checkpoint URL")
            model_dir = str(_export_champion(str(url), runs_dir() / "champions" / name / f"v{version}"))
        overrides += [f"model.path={model_dir}", "train.sft_warmup_steps=0"]
        logger.info("starting from the champion of %s: version %s (%s)", name, version, model_dir)
    elif params.get("if_no_champion") == "train_from_config":
        logger.warning("registered model %r has no champion yet: training from the config's model", name)
    else:
        raise AirflowFailException(
            f"registered model {name!r} has no 'champion' alias yet: run areal_rl_training first (its first "
            "registered version becomes champion), or trigger with if_no_champion=train_from_config"
        )
    extra = _latest_asset_extra(context, asset_name)
    dataset = asset_event_dataset(extra)
    if dataset:
        overrides.append(f"dataset.path={dataset}")
        logger.info("new training data from the Asset event: %s", dataset)
    return {"overrides": overrides, "champion_version": (champion or {}).get("version"), "asset_extra": extra}
