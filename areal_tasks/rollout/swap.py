"""How the rollout executor brackets a weight update: admission stops, the servers pause, load and
resume, then the new version and admission reach the episodes' loop, in that order.

:class:`WeightSwap` holds the loop-side steps (:meth:`~WeightSwap.pause`, :meth:`~WeightSwap.resume`,
:meth:`~WeightSwap.swap`) and the control loop (:mod:`areal_tasks.rollout.control_loop`) a swap is
sent from while the executor runs and the engine allows it (``control_from_any_loop``): the swap
then does not queue behind the episodes on their busy loop; admission stops at once (a flag the
episodes' loop reads), and the version and admission are posted to the episodes' loop after it.

Each swap first adopts the server list the controller published after restarting a dead server,
and a swap that failed because servers do not answer at all goes on without them
(:class:`~areal_tasks.rollout.servers.ServerRoster`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from areal_tasks.errors import InferenceControlError, RolloutError
from areal_tasks.rollout.control_loop import ControlLoop, prompt_thread_switches
from areal_tasks.rollout.groups import GroupAssembly
from areal_tasks.rollout.servers import ServerRoster

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine, ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.rollout.loop_thread import LoopThread

__all__ = ["WeightSwap"]


class WeightSwap:
    """The weight-update steps of one executor over ``engine`` and its ``groups``."""

    def __init__(
        self, engine: InferenceEngine, groups: GroupAssembly, control_name: str, roster: ServerRoster | None = None
    ) -> None:
        self.engine, self.groups = engine, groups
        self.control_name = control_name
        self.roster = roster or ServerRoster(None)
        #: the loop swaps run on while the executor runs (made at the first such swap).
        self.control: ControlLoop | None = None

    @property
    def may_use_control_loop(self) -> bool:
        """Whether the engine accepts control calls from another event loop than its requests'."""
        return bool(getattr(self.engine, "control_from_any_loop", False))

    def control_loop(self) -> ControlLoop:
        """The control loop, made at the first call (the caller holds the executor's lock)."""
        if self.control is None:
            self.control = ControlLoop(self.control_name)
        return self.control

    async def pause(self, mode: PauseMode) -> None:
        """Loop side: stop admitting, then pause the engine."""
        self.groups.paused = True
        await self.engine.pause(mode)

    async def resume(self) -> None:
        """Loop side: resume the engine, then admit again."""
        await self.engine.resume()
        self.groups.reopen()

    async def swap(
        self,
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        version: int,
        mode: PauseMode,
        submitted: float,
    ) -> dict[str, float]:
        """On the episodes' loop: the whole swap, then the version and admission."""
        self.groups.paused = True  # no admission until the new version is set
        parts = await self._timed(meta, buckets, mode, submitted)
        self._swapped(version)
        return parts

    def swap_from_control_loop(
        self,
        episodes: LoopThread,
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        version: int,
        mode: PauseMode,
        submitted: float,
    ) -> dict[str, float]:
        """From the control loop (caller's thread waits): the swap, then the version and admission
        posted to the ``episodes`` loop, which runs them before any later call to the executor."""
        control = self.control_loop()
        self.groups.paused = True  # a flag the loop's admission reads: no admission until the version is set
        with prompt_thread_switches():
            parts = control.run(self._timed, meta, buckets, mode, submitted)
        try:
            episodes.loop.call_soon_threadsafe(self._swapped, version)
        except RuntimeError:  # the loop is closed
            raise RolloutError(
                f"the rollout executor was stopped while the weight swap to version {version} ran; "
                "the servers hold the new weights, the executor admits nothing more"
            ) from None
        return parts

    def close(self) -> None:
        """Close the control loop, if any, with its connections."""
        if self.control is not None:
            self.control.close(self.engine.aclose)

    async def _timed(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None, mode: PauseMode, submitted: float
    ) -> dict[str, float]:
        queued = time.perf_counter() - submitted
        self.roster.refresh(self.engine, meta)
        try:
            parts = await self.engine.swap_weights(meta, buckets, mode)
        except InferenceControlError as exc:
            parts = await self.roster.swap_without_unreachable(self.engine, meta, buckets, mode, exc)
        return {"queue": queued, **parts}

    def _swapped(self, version: int) -> None:
        """Loop side, after a swap: the new version, then admission again."""
        from areal_tasks.trace import set_step

        set_step(version + 1, weak=True)  # what is generated from now on trains step version + 1
        self.groups.set_version(version)
        self.groups.reopen()
