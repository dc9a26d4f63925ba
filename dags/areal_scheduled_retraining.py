"""``areal_scheduled_retraining``: retrain the registry's champion on new data, or on a schedule.

Runs when the training-data Asset gets a new event, and on a cron schedule (whichever comes first):

* the Asset is ``areal_training_data`` (URI ``$AREAL_TRAINING_DATA_URI``, default
  ``file:///opt/areal/data/train``: a local/NFS directory or an ``s3://`` prefix). Landing a data
  file there is enough: the Asset's watcher (an ``AssetWatcher`` running
  :class:`~operators.triggers.new_files.NewDataFileTrigger` in the triggerer) lists the prefix every
  ``$AREAL_TRAINING_DATA_POLL_S`` seconds (default 60) and emits one Asset event per new complete
  file whose name matches ``$AREAL_TRAINING_DATA_PATTERN`` (default ``*.jsonl``; hidden and
  ``.tmp-``/``_temporary`` names never fire, so upload under such a name and rename), with the
  file in the event's ``extra.payload.dataset``. ``$AREAL_TRAINING_DATA_WATCH=false`` turns the
  watcher off. A data pipeline may also update the Asset with ``outlets=[Asset(...)]`` on its
  producing task, or anyone with the REST API (``POST /api/v2/assets/events`` with ``asset_id`` and
  an optional ``extra``). ``extra.dataset`` (or the watcher's ``extra.payload.dataset``) names the
  data to train on (a ``dataset.path`` value), overriding the Param;
* the cron expression is ``$AREAL_RETRAIN_CRON`` (default ``0 3 * * 0``: Sundays 03:00 UTC); set it
  to ``none`` for Asset-only scheduling.

::

    start_from_champion >> resolve_job >> validate_storage >> ... >> register_model >> finish

``start_from_champion`` looks up the ``champion`` alias of the registered model and exports its
checkpoint as an HF model directory (cached under ``<runs>/champions/<name>/v<version>``); the job
then starts RL from it (``model.path`` = that directory, no SFT warm start) on the new data. The
rest is the ``areal_rl_training`` graph: the result is evaluated (``evaluate_checkpoint``), the new
version becomes ``candidate``, and ``champion`` only when its gate metric strictly beats the current
champion's (a tie or a worse candidate leaves ``champion`` where it was). Without a champion the
run fails with a clear message (Param ``if_no_champion`` = ``train_from_config`` trains from the
config's model instead).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, AssetWatcher, CronTriggerTimetable, Param
from areal_dag_common import common_dag_kwargs, evaluate_param, job_params, tracking_params
from areal_dag_tasks import resolve_job, start_from_champion, training_pipeline

from operators.triggers.new_files import NewDataFileTrigger

DAG_ID = "areal_scheduled_retraining"

_DATA_URI = os.environ.get("AREAL_TRAINING_DATA_URI") or "file:///opt/areal/data/train"
_WATCH = (os.environ.get("AREAL_TRAINING_DATA_WATCH") or "true").strip().lower() not in ("0", "false", "no", "off")
WATCHERS = (
    [
        AssetWatcher(
            name="areal_training_data_files",
            trigger=NewDataFileTrigger(
                url=_DATA_URI,
                pattern=os.environ.get("AREAL_TRAINING_DATA_PATTERN") or "*.jsonl",
                poll_interval=float(os.environ.get("AREAL_TRAINING_DATA_POLL_S") or 60),
            ),
        )
    ]
    if _WATCH
    else []
)
TRAINING_DATA = Asset(name="areal_training_data", uri=_DATA_URI, watchers=WATCHERS)
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
