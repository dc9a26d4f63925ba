"""The rollout executor's protocol: what the RL loop asks of the executor, wherever it runs.

Train rank 0 drives its rollout executor through these methods only, whether the executor runs on
a thread of rank 0's own process (:class:`areal_tasks.rollout.executor.RolloutExecutor`) or in the
rollout process (:class:`areal_tasks.rollout.process.RemoteExecutor`, which forwards each call
over a pipe). The remote proxy and the rollout process's command table are derived from
:class:`RolloutExecutorProtocol` (:data:`EXECUTOR_METHODS`), so a method added here is a command
there, and ``tests/unit/rollout/test_executor_contract.py`` runs one contract against both.

The return annotation of each method says what crosses the process boundary: ``None`` (nothing is
sent back), ``Self`` (the executor itself: the proxy returns the proxy) or a value (pickled back).
:data:`GroupFilter` is the type of a group filter (DAPO's dynamic sampling), given by the algorithm
(``Algorithm.group_filter``) to the executor.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, runtime_checkable

from areal_tasks.api.workflow import Trajectory

if TYPE_CHECKING:
    from areal_tasks.api.inference import ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta

__all__ = ["EXECUTOR_METHODS", "GroupFilter", "Returns", "RolloutExecutorProtocol"]

#: a group filter: gets a finished group's trajectories; False drops the whole group.
GroupFilter = Callable[[list[Trajectory]], bool]
#: what a protocol method gives back: nothing, the executor itself, or a value.
Returns = Literal["none", "self", "value"]


@runtime_checkable
class RolloutExecutorProtocol(Protocol):
    """Generates training batches with bounded staleness and brackets the servers' weight updates.

    Lifecycle: optionally :meth:`load_state_dict`, :meth:`start`, then per training step
    :meth:`prepare_batch` and a weight update (:meth:`swap_weights`, or :meth:`pause`,
    :meth:`update_weights`, :meth:`resume` and :meth:`set_version`); finally :meth:`stop`. Arguments
    and results must pickle (the executor may run in another process). See ``docs/rollout.md``.
    """

    def start(self) -> Self:
        """Start generating (idempotent); returns the executor."""
        ...

    def stop(self) -> None:
        """Cancel in-flight episodes and stop the executor (idempotent; it cannot restart)."""
        ...

    def prepare_batch(self, timeout_s: float | None = None) -> list[Trajectory]:
        """Block until ``batch_size`` samples of whole groups are ready and return them."""
        ...

    def last_batch_stats(self) -> dict[str, float]:
        """Numbers about the last batch :meth:`prepare_batch` returned (empty before the first)."""
        ...

    def pause(self, mode: PauseMode = "abort") -> None:
        """Stop admitting groups, then pause the servers."""
        ...

    def resume(self) -> None:
        """Resume the servers, then admit groups again."""
        ...

    def update_weights(self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None = None) -> None:
        """Have the servers load ``meta``'s weights (for a collective update, while the trainer broadcasts)."""
        ...

    def swap_weights(
        self,
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        version: int,
        mode: PauseMode = "abort",
    ) -> dict[str, float]:
        """Pause, load ``meta``'s weights, set ``version`` and resume in one call; the parts' seconds."""
        ...

    def destroy_weight_groups(self) -> list[str]:
        """Make the servers leave the collective weight-update groups; returns their names."""
        ...

    def set_version(self, version: int) -> None:
        """Record the trainer's new version (after its weight update); raises the admission budget."""
        ...

    def mark_trained(self, step: int) -> None:
        """The oldest returned batch not yet marked was trained at ``step`` (the session trace)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters, rates and the staleness histogram."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The executor's checkpointable state (JSON-safe)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`; only before :meth:`start`."""
        ...


def _returns(method: Callable[..., Any]) -> Returns:
    annotation = inspect.signature(method).return_annotation
    if annotation in (None, "None"):
        return "none"
    if annotation in (Self, "Self"):
        return "self"
    return "value"


#: every method of :class:`RolloutExecutorProtocol`, in declaration order, with what it gives back.
EXECUTOR_METHODS: Mapping[str, Returns] = {
    name: _returns(member)
    for name, member in vars(RolloutExecutorProtocol).items()
    if inspect.isfunction(member) and not name.startswith("_")
}
