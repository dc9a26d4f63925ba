"""Operators of the areal-tasks pipeline (``execute -> defer -> execute_complete``, cancel in ``on_kill``)."""

from operators.operators.training import AReaLTrainingOperator

__all__ = ["AReaLTrainingOperator"]
