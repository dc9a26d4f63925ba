"""``ServerPool``: which server gets the next request (least loaded, with affinity; dead ones avoided).

A server is *dead* for a cooldown after it refused a connection (the cooldown doubles with each
consecutive failure); it is tried again afterwards, or earlier when no live server is left.
Choosing: the affinity server if it is alive and not to be avoided (a resumed partial rollout
returns to the server that holds its prefix in cache); otherwise the live server with the fewest
requests in flight, ties broken by fewest requests ever assigned, then by position.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from areal_tasks.errors import InferenceError

logger = logging.getLogger(__name__)

__all__ = ["ServerPool", "ServerState", "normalize_address"]

_MAX_COOLDOWN_DOUBLINGS = 5


def normalize_address(address: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port``."""
    address = address.strip().rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


@dataclass
class ServerState:
    """Book-keeping of one server."""

    address: str
    in_flight: int = 0
    assigned: int = 0
    failures: int = 0
    dead_until: float = 0.0


class ServerPool:
    """Load and health book-keeping over a list of server addresses."""

    def __init__(
        self,
        addresses: Sequence[str],
        dead_cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cooldown = dead_cooldown_s
        self._clock = clock
        self._states: dict[str, ServerState] = {}
        self.set_addresses(addresses)

    @property
    def addresses(self) -> list[str]:
        """Server base URLs, in order."""
        return list(self._states)

    def set_addresses(self, addresses: Sequence[str]) -> None:
        """Replace the server list; servers that stay keep their book-keeping."""
        normalized = [normalize_address(a) for a in addresses]
        if not normalized:
            raise InferenceError("the inference client needs at least one server address")
        if len(set(normalized)) != len(normalized):
            raise InferenceError(f"duplicate server addresses: {normalized}")
        self._states = {a: self._states.get(a) or ServerState(a) for a in normalized}

    def is_alive(self, address: str) -> bool:
        """Whether ``address`` is known and not in its dead cooldown."""
        state = self._states.get(address)
        return state is not None and state.dead_until <= self._clock()

    def choose(self, affinity: str | None = None, avoid: Collection[str] = ()) -> str:
        """The server for the next attempt (see the module doc)."""
        if affinity is not None and affinity not in avoid and self.is_alive(affinity):
            return affinity
        order = {a: i for i, a in enumerate(self._states)}
        now = self._clock()

        def rank(s: ServerState) -> tuple[bool, bool, float, int, int, int]:
            dead = s.dead_until > now
            return (dead, s.address in avoid, s.dead_until if dead else 0.0, s.in_flight, s.assigned, order[s.address])

        return min(self._states.values(), key=rank).address

    def acquire(self, address: str) -> None:
        """Count one request in flight on ``address``."""
        state = self._states.get(address)
        if state is not None:
            state.in_flight += 1
            state.assigned += 1

    def release(self, address: str) -> None:
        """The request counted by :meth:`acquire` is done (a removed server is ignored)."""
        state = self._states.get(address)
        if state is not None:
            state.in_flight -= 1

    def mark_dead(self, address: str) -> None:
        """``address`` refused a connection: avoid it for a cooldown."""
        state = self._states.get(address)
        if state is None:
            return
        state.failures += 1
        cooldown = self._cooldown * 2 ** min(state.failures - 1, _MAX_COOLDOWN_DOUBLINGS)
        state.dead_until = self._clock() + cooldown
        logger.warning(
            "server %s is unreachable (%d in a row); avoiding it for %.1fs", address, state.failures, cooldown
        )

    def mark_ok(self, address: str) -> None:
        """``address`` answered: it is alive."""
        state = self._states.get(address)
        if state is not None and (state.failures or state.dead_until):
            logger.info("server %s answers again", address)
            state.failures = 0
            state.dead_until = 0.0

    def snapshot(self) -> list[ServerState]:
        """Copies of every server's book-keeping, in order."""
        return [replace(s) for s in self._states.values()]
