"""One agent session of the proxy, and what it leaves when it ends: a group of training samples.

A :class:`Session` owns its own ``ArealOpenAI`` client (and so its own ``InteractionCache``): every
request made under its key is generated and recorded there, and no other session can see it. When
the session ends (asked to, or expired), its cache becomes a :class:`SessionResult`: the group
``GET /rl/groups/next`` and ``ProxySessions.next_group`` hand out, exported to the trainer's
:class:`~areal_tasks.api.workflow.Trajectory` in the concat style (one sample per conversation)
or the individual style (one per completion).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_tasks.agent.interactions import ExportStyle, Interaction, InteractionCache
    from areal_tasks.api.workflow import Trajectory

logger = logging.getLogger(__name__)

__all__ = ["EndReason", "Session", "SessionResult", "SessionState"]


class SessionState(str, enum.Enum):
    """Where a session is in its life."""

    OPEN = "open"
    #: refusing new requests, waiting for those in flight (``end_session`` in progress).
    ENDING = "ending"
    ENDED = "ended"


class EndReason(str, enum.Enum):
    """Why a session ended."""

    ENDED = "ended"
    IDLE_TIMEOUT = "idle_timeout"
    MAX_LIFETIME = "max_lifetime"
    SERVER_STOPPED = "server_stopped"

    @property
    def expired(self) -> bool:
        return self in (EndReason.IDLE_TIMEOUT, EndReason.MAX_LIFETIME)


@dataclass
class SessionResult:
    """An ended session's interactions: one group of training samples."""

    session_id: str
    reason: EndReason
    cache: InteractionCache
    created: float
    ended: float

    @property
    def interactions(self) -> list[Interaction]:
        """Every completion of the session, in the order they were made."""
        return list(self.cache)

    @property
    def reward(self) -> float | None:
        """The reward of the session's last completion (None when unset or there was none)."""
        items = self.interactions
        return items[-1].reward if items else None

    def trajectories(self, style: ExportStyle = "concat") -> list[Trajectory]:
        """The training samples (``InteractionCache.export``)."""
        return self.cache.export(style)

    def to_dict(self, style: ExportStyle = "concat") -> dict[str, Any]:
        """The JSON export of ``GET /rl/groups/next`` and ``--export-dir``."""
        trajectories = self.trajectories(style)
        return {
            "session_id": self.session_id,
            "reason": self.reason.value,
            "style": style,
            "reward": self.reward,
            "rewards": [t.reward for t in trajectories],
            "interactions": len(self.cache),
            "created": self.created,
            "ended": self.ended,
            "trajectories": [dataclasses.asdict(t) for t in trajectories],
        }


@dataclass(eq=False)
class Session:
    """A session's state. ``client`` (its ``ArealOpenAI``) is dropped once it ended; the store keeps
    the rest for a while to answer status queries and to refuse its key naming why."""

    id: str
    key_digest: bytes = field(repr=False)
    client: Any
    created: float = field(default_factory=time.monotonic)
    created_wall: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    state: SessionState = SessionState.OPEN
    reason: EndReason | None = None
    in_flight: int = 0
    interactions: int = 0
    #: generation tasks running for this session (cancelled when its end's drain runs out).
    tasks: set[asyncio.Task[Any]] = field(default_factory=set, repr=False)
    idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    ending: asyncio.Future[SessionResult] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def cache(self) -> InteractionCache:
        return self.client.cache

    def status(self, now: float) -> dict[str, Any]:
        """What ``GET /rl/sessions/{id}`` answers."""
        count = len(self.cache) if self.client is not None else self.interactions
        return {
            "session_id": self.id,
            "state": self.state.value,
            "reason": None if self.reason is None else self.reason.value,
            "interactions": count,
            "in_flight": self.in_flight,
            "age_s": now - self.created,
            "idle_s": 0.0 if self.in_flight else now - self.last_active,
            "created": self.created_wall,
        }
