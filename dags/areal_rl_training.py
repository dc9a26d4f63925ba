"""``areal_rl_training``: one RL post-training job, from pre-flight checks to a registered model.

::

    resolve_job >> validate_storage >> detect_model >> provision_cluster >> start_mlflow_run
        >> train >> checkpoints_to_evaluate >> evaluate_checkpoint[*] >> register_model >> finish

* ``resolve_job`` loads the config file with the Params as overrides, validates it (every problem
  at once; a bad Param fails the run in a second, without retries) and writes the resolved config
  to ``<run dir>/config.yaml``, which every later task reads;
* ``validate_storage`` runs the storage pre-flight checks: a misconfigured bucket or path fails
  here, seconds after the trigger, before anything big starts;
* ``detect_model`` and ``provision_cluster`` check the model and the resources;
* ``start_mlflow_run`` creates the MLflow run the whole DAG run logs into (the training job's MLflow
  callback attaches to it through ``$AREAL_MLFLOW_RUN_ID``);
* ``train`` submits the job to the cluster scheduler and defers to the triggerer while it runs; a
  retry reattaches to a job still running or resumes a failed one from its last checkpoint; marking
  the task failed or clearing it cancels the job;
* ``evaluate_checkpoint`` is mapped over the final checkpoint (or every checkpoint);
* ``register_model`` registers the best evaluated checkpoint: alias ``candidate`` always,
  ``champion`` when it beats the current champion's gate metric;
* ``finish`` ends the MLflow run and adds the pipeline's results to ``<run dir>/summary.json``.

Trigger it from the UI (the form is built from the Params), the REST API, or the command line::

    airflow dags trigger areal_rl_training --conf '{"max_steps": 320}'
    airflow dags test areal_rl_training --conf '{"run_dir": "/tmp/run"}'    # what `make run` does
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from areal_dag_common import common_dag_kwargs, evaluate_param, job_params, tracking_params
from areal_dag_tasks import resolve_job, training_pipeline

DAG_ID = "areal_rl_training"

PARAMS: dict[str, Any] = {
    **job_params(),
    "evaluate": evaluate_param(),
    **tracking_params(),
}

with DAG(
    dag_id=DAG_ID,
    description="RL post-training: pre-flight checks, the RL job, checkpoint evaluation, model registry",
    schedule=None,
    max_active_runs=4,
    params=PARAMS,
    tags=["areal", "training"],
    doc_md=__doc__,
    **common_dag_kwargs(),
) as dag:
    training_pipeline(resolve_job())
