"""Triggers (run in Airflow's triggerer): ``TrainingJobTrigger`` waits for an RL job to end."""

from operators.triggers.training_job import TrainingJobTrigger

__all__ = ["TrainingJobTrigger"]
