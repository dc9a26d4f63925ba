"""Bounded staleness: when a new group may start, and which finished groups the next batch takes.

Pure functions over counters, no I/O (the executor calls them on its event loop). Notation: ``B`` is
the batch size in samples, ``g`` the group size, ``eta`` ``max_head_offpolicyness``, ``v`` the
trainer's version and ``v0`` the *base version*, the trainer version at which the sample counters
were zero (the version the executor was built with). The trainer is assumed to raise its version by
one per consumed batch (one weight update per training step), so when it is at version ``v`` it has
consumed ``v - v0`` batches and will have consumed ``v + eta + 1 - v0`` once it has trained at
version ``v + eta``.

**Admission.** A group may start only if ::

    in_flight_episodes + g <= max_concurrent_rollouts                       (concurrency)
    consumed + ready + running + g <= (eta + v - v0 + 1) * B                (staleness budget)

where ``consumed`` counts samples already returned by ``prepare_batch``, ``ready`` accepted samples
waiting, ``running`` the samples of groups still generating (a rejected, filtered or failed group
gives its samples back). So everything started while the trainer is at ``v`` fits into the batches
the trainer takes up to version ``v + eta``. With ``eta = 0`` nothing for batch ``k + 1`` is
generated before the trainer has moved to version ``v0 + k + 1``: synchronous RL from the same code.

**Deadlines.** A group admitted at trainer version ``a`` has deadline ``a + eta``: the latest
trainer version whose batch it should be in. What happens to a group that is not finished by then
is the *staleness bound* (``rollout.staleness_bound``), the ``bound`` argument of
:func:`select_batch`:

``"sample"`` (the default): eta bounds every returned sample. Groups finish out of order (long
tails), so taking them in completion order alone would let a slow early group slip past its
deadline. :func:`select_batch` takes the ``B / g`` finished groups with the earliest deadlines
(completion order among equal deadlines) and returns them only if what remains can still meet its
deadlines, i.e. for every deadline ``D >= v``::

    #(groups left, ready or running, with deadline <= D) <= (D - v) * B / g

(none may be left with a deadline ``<= v``). Otherwise it waits for a running group with an earlier
deadline. The admission budget guarantees that this condition can always be met once the running
groups finish, so the wait ends; by induction every group meets its deadline and the staleness of
every returned sample (trainer version at return minus admission version) is at most ``eta``. If
the trainer raises its version by more than one per batch the bound cannot hold; the batch is then
returned anyway (best effort) and the caller logs it. The price: all groups admitted at ``v`` share
the deadline ``v + eta``, so the batch at ``v + eta`` waits for the slowest of them.

``"admission"`` (AReaL's rule): eta bounds admission only. :func:`select_batch` takes the first
``B / g`` finished groups in completion order and never waits for a running group once that many
are ready; a long-tail group is consumed when it finishes, possibly after its deadline, with a
staleness above ``eta`` (the caller counts those samples; it is not an error). The admission budget
still bounds what is in flight: at most ``(eta + 1) * B`` samples are ready or running at a time
(one batch consumed per version), so a slow group holds back admission, not the trainer.

With ``eta = 0`` both bounds give the same batches: the budget is one batch, so when ``B / g``
groups are ready nothing else is running and the batch is everything admitted, in completion order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, get_args

__all__ = ["STALENESS_BOUNDS", "AdmissionRule", "HasDeadline", "StalenessBound", "select_batch"]

#: what ``eta`` bounds (``rollout.staleness_bound``): every returned sample, or only admission.
StalenessBound = Literal["sample", "admission"]
STALENESS_BOUNDS: tuple[StalenessBound, ...] = get_args(StalenessBound)


@dataclass(frozen=True)
class AdmissionRule:
    """The admission rule of the module docstring for one executor's settings."""

    batch_size: int
    group_size: int
    max_concurrent: int
    eta: int

    def budget(self, version: int, base_version: int) -> int:
        """Samples the trainer will have consumed once it has trained at version ``version + eta``."""
        return max(0, (self.eta + version - base_version + 1) * self.batch_size)

    def staleness_room(self, *, version: int, base_version: int, consumed: int, ready: int, running: int) -> int:
        """Samples the staleness budget still allows to start (may be negative after a version rollback)."""
        return self.budget(version, base_version) - (consumed + ready + running)

    def concurrency_room(self, in_flight: int) -> int:
        """Episodes that may still start under ``max_concurrent_rollouts``."""
        return self.max_concurrent - in_flight

    def may_admit(
        self, *, version: int, base_version: int, consumed: int, ready: int, running: int, in_flight: int
    ) -> bool:
        """True when one more group of ``group_size`` episodes may start."""
        room = self.staleness_room(
            version=version, base_version=base_version, consumed=consumed, ready=ready, running=running
        )
        return room >= self.group_size and self.concurrency_room(in_flight) >= self.group_size


class HasDeadline(Protocol):
    """A group as :func:`select_batch` sees it."""

    @property
    def deadline(self) -> int: ...


G = TypeVar("G", bound=HasDeadline)


def select_batch(
    ready: Sequence[G],
    running_deadlines: Iterable[int],
    *,
    version: int,
    groups_per_batch: int,
    bound: StalenessBound = "sample",
) -> tuple[list[G] | None, bool]:
    """Pick the next batch from ``ready`` (in completion order) at trainer version ``version``.

    Returns ``(groups, on_time)``: ``groups`` is None when the executor must wait (too few ready
    groups or, with ``bound="sample"``, a running group with an earlier deadline is needed for the
    rest to stay on time); ``on_time`` is False when a ``"sample"`` batch is returned although some
    remaining group will miss its deadline (possible only when the trainer version rose by more than
    one per batch). With ``bound="admission"`` deadlines are no promise: the first
    ``groups_per_batch`` ready groups are returned, ``running_deadlines`` is not looked at, and
    ``on_time`` is always True (see the module docstring).
    """
    if bound not in STALENESS_BOUNDS:
        raise ValueError(f"bound={bound!r} must be one of {', '.join(map(repr, STALENESS_BOUNDS))}")
    if len(ready) < groups_per_batch:
        return None, True
    if bound == "admission":
        return list(ready[:groups_per_batch]), True
    running = list(running_deadlines)
    ordered = sorted(ready, key=lambda grp: grp.deadline)  # stable: completion order among equal deadlines
    chosen = ordered[:groups_per_batch]
    rest = sorted([grp.deadline for grp in ordered[groups_per_batch:]] + running)
    feasible = all(n + 1 <= max(0, d - version) * groups_per_batch for n, d in enumerate(rest))
    if feasible:
        return chosen, True
    latest = chosen[-1].deadline
    if any(d < latest for d in running):
        return None, True  # an earlier-deadline group is still generating: it has to go first
    return chosen, False
