"""Where and how long the embedded server's weight operations may run, and whether one is stuck.

:class:`WeightGuard` is what :class:`~areal_tasks.inference.server.weight_service.WeightService`
runs its blocking parts through:

* **Lanes.** Staging and receiving weights run on the ``weights`` lane, joining and leaving a
  weight-update group on the ``groups`` lane (:mod:`~areal_tasks.inference.server.executors`),
  never on the event loop or asyncio's shared executor. A call on a lane whose thread is taken is
  refused at once (409): our own updates are serialised by the service's lock, so a taken thread
  means an earlier call is still running past its deadline, and queueing behind it would only
  start the work long after its caller gave up. A call past its deadline answers 504 and keeps
  its thread (a thread cannot be killed).
* **Holding generation.** The drain before an update on a server that is not paused and the pause
  of ``/areal/swap_weights`` hold requests back; each is recorded with the deadline it should end
  by (:meth:`WeightGuard.holding_generation`). The drain itself fails with 503 past
  its own deadline (:meth:`WeightGuard.drain`).
* **Stuck.** :meth:`WeightGuard.stuck_reason` names an operation holding generation past its
  deadline or a lane call past its deadline; ``/health`` answers 503 with it, so the fleet
  restarts the server (a requested pause is never a reason: the fleet would restart servers
  during every weight update).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any, TypeVar

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.executors import LaneBusyError, Lanes, LaneTimeoutError

logger = logging.getLogger(__name__)

__all__ = ["APPLY_ALLOWANCE_S", "GRACE_S", "WEIGHT_LANES", "WeightGuard", "WeightOperationError"]

T = TypeVar("T")

#: seconds a lane call may run past the bound its own code enforces (torch's rendezvous and group
#: timeouts) before the lane gives up on it: the call's own error comes first when it keeps its bound.
GRACE_S = 5.0
#: seconds the copy of staged tensors into the model between two steps may take before an update
#: holding generation counts as stuck.
APPLY_ALLOWANCE_S = 60.0
#: the lanes weight operations use (a shared :class:`Lanes` may have others, e.g. ``tokenize``).
WEIGHT_LANES = ("weights", "groups")
_DRAIN_POLL_S = 0.005


class WeightOperationError(InferenceError):
    """A weight operation refused or cut short by a bound; ``status`` is the HTTP answer (409 a
    lane busy, 503 a drain past its deadline or a server shutting down, 504 a call past its deadline)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class WeightGuard:
    """The lanes, deadlines and stuck-state of one server's weight operations (see the module doc).

    ``lanes``: the server's lanes when it shares them (they must have :data:`WEIGHT_LANES`); else
    the guard makes one-thread ``weights`` and ``groups`` lanes and shuts them down in :meth:`close`.
    """

    def __init__(self, engine: Engine, drain_timeout_s: float, lanes: Lanes | None = None) -> None:
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s
        self._own_lanes = lanes is None
        self.lanes = Lanes(dict.fromkeys(WEIGHT_LANES, 1)) if lanes is None else lanes
        #: operations holding generation back: id -> (what, deadline)
        self._holding: dict[int, tuple[str, float]] = {}
        self._hold_ids = itertools.count()
        self._closing = False

    async def run(self, lane: str, fn: Callable[..., T], *args: Any, timeout_s: float, what: str) -> T:
        """``fn(*args)`` on ``lane``: refused at once (409) when the lane's thread is taken, 504 past
        ``timeout_s``, 503 once the server is shutting down."""
        if self._closing:
            raise WeightOperationError("the server is shutting down", HTTPStatus.SERVICE_UNAVAILABLE)
        try:
            return await self.lanes.run(lane, fn, *args, timeout_s=timeout_s, what=what, refuse_when_busy=True)
        except LaneBusyError:
            raise WeightOperationError(
                f"{what}: another weight operation is still running on the {lane} lane (past its deadline "
                "if it is reported by /health); try again later",
                HTTPStatus.CONFLICT,
            ) from None
        except LaneTimeoutError:
            logger.error("%s did not finish within %.0f s; its thread is left running", what, timeout_s)
            raise WeightOperationError(
                f"{what} did not finish within {timeout_s:g} s", HTTPStatus.GATEWAY_TIMEOUT
            ) from None

    @contextlib.asynccontextmanager
    async def holding_generation(self, what: str, bound_s: float) -> AsyncIterator[None]:
        """Record that ``what`` holds generation back for at most ``bound_s`` (:meth:`stuck_reason`)."""
        key = next(self._hold_ids)
        self._holding[key] = (what, time.monotonic() + bound_s)
        try:
            yield
        finally:
            self._holding.pop(key, None)

    async def drain(self) -> None:
        """Wait for the requests in flight, at most ``drain_timeout_s`` (then 503)."""
        deadline = time.monotonic() + self.drain_timeout_s
        while in_flight := self.engine.in_flight():
            if time.monotonic() > deadline:
                raise WeightOperationError(
                    f"server busy: {in_flight} sequences still in flight after {self.drain_timeout_s:g} s; "
                    "the update was not applied (pause generation first, or retry)",
                    HTTPStatus.SERVICE_UNAVAILABLE,
                )
            await asyncio.sleep(_DRAIN_POLL_S)

    def stuck_reason(self) -> str | None:
        """Why a weight operation keeps the server from serving, or None: an update holding new
        requests back, or a swap holding generation paused, past its deadline; or a weight-lane
        call past its deadline (its thread still taken: later updates or group set-ups would be
        refused until a restart)."""
        now = time.monotonic()
        held = [f"{what} ({now - deadline:.0f} s past its deadline)" for what, deadline in self._holding.values()]
        if held:
            return "a weight update holds generation: " + "; ".join(held)
        overdue = [call for call in self.lanes.overdue() if call.split(":", 1)[0] in WEIGHT_LANES]
        if overdue:
            return "a weight operation is stuck: " + "; ".join(overdue)
        return None

    def close(self) -> None:
        """Refuse new weight operations (503); shut the guard's own lanes down without waiting for
        a thread still running."""
        self._closing = True
        if self._own_lanes:
            self.lanes.shutdown()
