"""Rollout workflows: one dataset item in, one :class:`~areal_tasks.api.workflow.Trajectory` out.

* :class:`RLVRWorkflow` (``rlvr``): one answer scored by a verifiable reward.
* :class:`MultiTurnWorkflow` (``multi_turn``): retries after feedback, with a discounted reward.

:data:`WORKFLOWS` maps each name to a factory ``factory(tokenizer, sampling, reward, **options)``;
every workflow listed there is covered by the contract test
(``tests/unit/rollout/test_workflow_contract.py``), so register new ones there. See
``docs/workflows.md``.
"""

from __future__ import annotations

import importlib
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
    "resolve_workflow",
]


class WorkflowFactory(Protocol):
    """Builds a workflow from a tokenizer, sampling parameters, a reward and keyword options."""

    def __call__(
        self, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, **options: Any
    ) -> RolloutWorkflow: ...


#: every built-in workflow, by name.
WORKFLOWS: dict[str, WorkflowFactory] = {
    "rlvr": RLVRWorkflow,
    "multi_turn": MultiTurnWorkflow,
}


def resolve_workflow(name: str) -> WorkflowFactory:
    """The factory registered as ``name``, or the one at import path ``package.module:factory``."""
    if name in WORKFLOWS:
        return WORKFLOWS[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"unknown workflow {name!r}; known: {', '.join(sorted(WORKFLOWS))}, or an import path "
            "package.module:factory of factory(tokenizer, sampling, reward, **options)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"workflow {name!r}: cannot import {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"workflow {name!r}: {module_name!r} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


def make_workflow(
    name: str, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, **options: Any
) -> RolloutWorkflow:
    """The workflow ``name`` (registered, or an import path) built with ``options``; ConfigError if unknown."""
    workflow = resolve_workflow(name)(tokenizer, sampling, reward, **options)
    if not isinstance(workflow, RolloutWorkflow):
        raise ConfigError(f"workflow {name!r} built a {type(workflow).__name__}, not a RolloutWorkflow")
    return workflow
