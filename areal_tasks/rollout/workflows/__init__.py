"""Rollout workflows: one dataset item in, one :class:`~areal_tasks.api.workflow.Trajectory` out.

* :class:`RLVRWorkflow` (``rlvr``): one answer scored by a verifiable reward.
* :class:`MultiTurnWorkflow` (``multi_turn``): retries after feedback, with a discounted reward.

:data:`WORKFLOWS` (:mod:`.registry`) maps each name to a factory
``factory(tokenizer, sampling, reward, **options)``; every workflow registered there is covered by
the contract test (``tests/unit/rollout/test_workflow_contract.py``), so register new ones there
(``WORKFLOWS.register(name, factory)``). See ``docs/workflows.md``.
"""

from __future__ import annotations

from areal_tasks.rollout.workflows.multi_turn import DEFAULT_FEEDBACK, MultiTurnOptions, MultiTurnWorkflow
from areal_tasks.rollout.workflows.registry import (
    WORKFLOWS,
    WorkflowFactory,
    build_workflow,
    check_workflow,
    make_workflow,
    resolve_workflow,
    workflow_problems,
)
from areal_tasks.rollout.workflows.rlvr import RewardFn, RLVROptions, RLVRWorkflow, item_fields, reward_extras
from areal_tasks.rollout.workflows.tokens import FeedbackSegment, TrajectoryBuilder, feedback_segment

__all__ = [
    "DEFAULT_FEEDBACK",
    "WORKFLOWS",
    "FeedbackSegment",
    "MultiTurnOptions",
    "MultiTurnWorkflow",
    "RLVROptions",
    "RLVRWorkflow",
    "RewardFn",
    "TrajectoryBuilder",
    "WorkflowFactory",
    "build_workflow",
    "check_workflow",
    "feedback_segment",
    "item_fields",
    "make_workflow",
    "resolve_workflow",
    "reward_extras",
    "workflow_problems",
]
