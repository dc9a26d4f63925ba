"""Rollout workflows: one dataset item in, one :class:`~areal_tasks.api.workflow.Trajectory` out.

* :class:`RLVRWorkflow` (``rlvr``): one answer scored by a verifiable reward.
* :class:`MultiTurnWorkflow` (``multi_turn``): retries after feedback, with a discounted reward.

:data:`WORKFLOWS` maps each name to a factory ``factory(tokenizer, sampling, reward, **options)``;
every workflow listed there is covered by the contract test
(``tests/unit/rollout/test_workflow_contract.py``), so register new ones there. See
``docs/workflows.md``.
"""

from __future__ import annotations

from typing import Any, Protocol

from areal_tasks.api.inference import SamplingParams
from areal_tasks.api.workflow import RolloutWorkflow
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.workflows.multi_turn import DEFAULT_FEEDBACK, MultiTurnWorkflow
from areal_tasks.rollout.workflows.rlvr import RewardFn, RLVRWorkflow, item_fields
from areal_tasks.rollout.workflows.tokens import FeedbackSegment, TrajectoryBuilder, feedback_segment

__all__ = [
    "DEFAULT_FEEDBACK",
    "WORKFLOWS",
    "FeedbackSegment",
    "MultiTurnWorkflow",
    "RLVRWorkflow",
    "RewardFn",
    "TrajectoryBuilder",
    "WorkflowFactory",
    "feedback_segment",
    "item_fields",
    "make_workflow",
]


class WorkflowFactory(Protocol):
    """Builds a workflow from a tokenizer, sampling parameters, a reward and keyword options."""

    def __call__(self, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, **options: Any) -> RolloutWorkflow:
        ...


#: every built-in workflow, by name.
WORKFLOWS: dict[str, WorkflowFactory] = {
    "rlvr": RLVRWorkflow,
    "multi_turn": MultiTurnWorkflow,
}


def make_workflow(name: str, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, **options: Any) -> RolloutWorkflow:
    """The workflow registered as ``name``, built with ``options``; ConfigError for an unknown name."""
    if name not in WORKFLOWS:
        raise ConfigError(f"unknown workflow {name!r}; known: {', '.join(sorted(WORKFLOWS))}")
    return WORKFLOWS[name](tokenizer, sampling, reward, **options)
