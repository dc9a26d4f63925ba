"""``areal_scheduled_retraining``: retrain the registry's champion on new data, or on a schedule.

Runs when the training-data Asset gets a new event, and on a cron schedule (whichever comes first):

* the Asset is ``areal_training_data`` (URI ``$AREAL_TRAINING_DATA_URI``, default
  ``file:///opt/areal/data/train``). A data pipeline updates it with ``outlets=[Asset(...)]`` on its
  producing task, or anyone with the REST API (``POST /api/v2/assets/events`` with ``asset_id``
  and an optional ``extra``). ``extra.dataset`` names the data to train on (a ``dataset.path``
  value), overriding the Param;
* the cron expression is ``$AREAL_RETRAIN_CRON`` (default ``0 3 * * 0``: Sundays 03:00 UTC); set it
  to ``none`` for Asset-only scheduling.

::

    start_from_champion >> resolve_job >> validate_storage >> ... >> register_model >> finish

``start_from_champion`` looks up the ``champion`` alias of the registered model and exports its
checkpoint as an HF model directory (cached under ``<runs>/champions/<name>/v<version>``); the job
then starts RL from it (``model.path`` = that directory, no SFT warm start). The rest is the
``areal_rl_training`` graph: the new version becomes ``candidate``, and ``champion`` only when it
beats the current champion's gate metric. Without a champion the run fails with a clear message
(Param ``if_no_champion`` = ``train_from_config`` trains from the config's model instead).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param
from areal_dag_common import common_dag_kwargs, evaluate_param, job_params, tracking_params
from areal_dag_tasks import resolve_job, start_from_champion, training_pipeline

DAG_ID = "areal_scheduled_retraining"

TRAINING_DATA = Asset(
    name="areal_training_data", uri=os.environ.get("AREAL_TRAINING_DATA_URI") or "file:///opt/areal/data/train"
)
_CRON = (os.environ.get("AREAL_RETRAIN_CRON") or "0 3 * * 0").strip()
SCHEDULE: Any = (
    TRAINING_DATA
    if _CRON.lower() == "none"
    else AssetOrTimeSchedule(timetable=CronTriggerTimetable(_CRON, timezone="UTC"), assets=TRAINING_DATA)
)

PARAMS: dict[str, Any] = {
    **job_params(),
    "max_steps": Param(
        40,
        type="integer",
        minimum=1,
        maximum=1_000_000,
        title="Max steps",
        description="train.total_steps of the retraining job (RL steps: the champion needs no SFT warm start).",
        section="Job",
    ),
    "evaluate": evaluate_param(),
    "if_no_champion": Param(
        "fail",
        type="string",
        enum=["fail", "train_from_config"],
        title="Without a champion",
        values_display={"fail": "fail the run", "train_from_config": "train from the config's model"},
        description="What to do when the registered model has no 'champion' alias yet.",
        section="Tracking and registry",
    ),
    **tracking_params(),
}

with DAG(
    dag_id=DAG_ID,
    description="Retrain the registry's champion on new data (Asset events) or on a cron schedule",
    schedule=SCHEDULE,
    max_active_runs=1,
    params=PARAMS,
    tags=["areal", "training", "scheduled"],
    doc_md=__doc__,
    **common_dag_kwargs(),
) as dag:
    champion = start_from_champion(TRAINING_DATA.name)
    job = resolve_job(overrides_from="start_from_champion")
    champion >> job
    training_pipeline(job)
