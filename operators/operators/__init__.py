"""Operators of the areal-tasks pipeline (``execute -> defer -> execute_complete``, cancel in ``on_kill``).

In pipeline order: :class:`ValidateStorageOperator`, :class:`DetectModelOperator`,
:class:`ProvisionClusterOperator`, :class:`AReaLTrainingOperator` (deferrable),
:class:`EvaluateCheckpointOperator` (mapped over checkpoints), :class:`RegisterModelOperator`.
"""

from operators.operators.cluster import ProvisionClusterOperator
from operators.operators.evaluation import EvaluateCheckpointOperator
from operators.operators.model import DetectModelOperator
from operators.operators.registry import RegisterModelOperator
from operators.operators.storage import ValidateStorageOperator
from operators.operators.training import AReaLTrainingOperator

__all__ = [
    "AReaLTrainingOperator",
    "DetectModelOperator",
    "EvaluateCheckpointOperator",
    "ProvisionClusterOperator",
    "RegisterModelOperator",
    "ValidateStorageOperator",
]
