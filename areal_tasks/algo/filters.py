"""Group filters: DAPO's dynamic sampling keeps only groups whose rewards are not all equal.

Dynamic sampling (Yu et al. 2025, eq. 11) over-samples and drops prompts whose responses are all
correct or all wrong (accuracy 1 or 0): under group-relative advantages those groups contribute no
gradient but still dilute the batch. The rollout executor applies the filter as each group finishes
(``Algorithm.group_filter``), so a dropped group is replaced by a new prompt before the batch is
taken. Departure: the test is "all rewards equal" on the raw rewards, which equals DAPO's accuracy
test for 0/1 rewards and generalises to graded rewards; a group of one sample is all-equal and is
dropped. Torch-free: it runs on the rollout side's event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from areal_tasks.api.workflow import Trajectory

__all__ = ["informative_group"]


def informative_group(group: Sequence[Trajectory]) -> bool:
    """True when the group's rewards are not all equal (a :data:`~areal_tasks.api.rollout.GroupFilter`)."""
    return len({float(t.reward) for t in group}) > 1
