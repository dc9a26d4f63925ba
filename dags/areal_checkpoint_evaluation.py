"""``areal_checkpoint_evaluation``: evaluate any checkpoint URL on demand.

::

    resolve_job >> start_mlflow_run >> evaluate_checkpoint >> register_requested >> register_model
        >> finish_evaluation

The checkpoint (a step directory such as ``file:///data/runs/x/storage/.../checkpoints/step_40`` or
``s3://bucket/.../step_40``) is served by one inference server and scored on the eval split of the
config's dataset (Params ``dataset`` and ``eval_prompts`` override it), or on the sets of the Param
``eval_sets``. Every metric (pass@1, pass@K, maj@K, ...) and a logged model pointing at the
checkpoint go to a new MLflow run; with Param ``register`` the checkpoint
also becomes a version of the registered model (alias ``candidate``; ``champion`` if it beats the
current one).

    airflow dags trigger areal_checkpoint_evaluation --conf '{"checkpoint_url": "s3://areal/.../step_40"}'
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, TriggerRule, task
from areal_dag_common import common_dag_kwargs, job_params, tracking_params
from areal_dag_tasks import (
    fail_mlflow_run,
    fail_run_on_any_failure,
    finish_evaluation,
    resolve_job,
    start_mlflow_run,
)

from operators.operators.evaluation import EvaluateCheckpointOperator
from operators.operators.registry import RegisterModelOperator

DAG_ID = "areal_checkpoint_evaluation"

_JOB = job_params()
PARAMS: dict[str, Any] = {
    "checkpoint_url": Param(
        type="string",
        minLength=1,
        title="Checkpoint URL",
        description="One checkpoint step directory: a path, file://... or s3://.../checkpoints/step_<N>.",
        section="Checkpoint",
    ),
    "register": Param(
        False,
        type="boolean",
        title="Register the checkpoint",
        description="Also register it as a version of the registered model (alias 'candidate').",
        section="Checkpoint",
    ),
    **{
        name: _JOB[name]
        for name in ("config", "dataset", "eval_sets", "eval_prompts", "experiment_name", "run_dir", "extra_overrides")
    },
    **tracking_params(),
}

with DAG(
    dag_id=DAG_ID,
    description="Evaluate one checkpoint URL on the eval split; log it to MLflow, optionally register it",
    schedule=None,
    max_active_runs=4,
    params=PARAMS,
    tags=["areal", "evaluation"],
    doc_md=__doc__,
    **common_dag_kwargs(),
) as dag:

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def register_requested(params: dict[str, Any] | None = None) -> bool:
        """Continue to ``register_model`` only when the Param ``register`` is on."""
        return bool((params or {}).get("register"))

    job = resolve_job()
    mlflow = start_mlflow_run(job)
    evaluation = EvaluateCheckpointOperator(
        task_id="evaluate_checkpoint",
        config=job["resolved_config"],
        checkpoint="{{ params.checkpoint_url }}",
        eval_sets=job["eval_sets"],
        mlflow_run_id=mlflow["mlflow_run_id"],
        mlflow_tracking_uri=mlflow["tracking_uri"],
        execution_timeout=timedelta(hours=2),
    )
    register = RegisterModelOperator(
        task_id="register_model",
        evaluations=evaluation.output,
        model_name="{{ params.registered_model_name }}",
        gate_metric="{{ params.gate_metric }}",
        mlflow_run_id=mlflow["mlflow_run_id"],
        mlflow_tracking_uri=mlflow["tracking_uri"],
        execution_timeout=timedelta(minutes=10),
    )
    finish = finish_evaluation.override(trigger_rule=TriggerRule.NONE_FAILED)(mlflow, evaluation.output)
    requested = register_requested()
    evaluation >> requested >> register >> finish
    cleanup = fail_mlflow_run()
    [evaluation, register, finish] >> cleanup
    fail_run_on_any_failure([job, mlflow, evaluation, requested, register, finish])
