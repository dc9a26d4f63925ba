"""Triggers (run in Airflow's triggerer): ``TrainingJobTrigger`` waits for an RL job to end;
``NewDataFileTrigger`` (an event trigger for ``AssetWatcher``) fires once per new data file."""

from operators.triggers.new_files import NewDataFileTrigger
from operators.triggers.training_job import TrainingJobTrigger

__all__ = ["NewDataFileTrigger", "TrainingJobTrigger"]
