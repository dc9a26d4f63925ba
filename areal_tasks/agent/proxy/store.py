"""The proxy's sessions: keys, per-session limits, ending and expiry, and the queue of finished groups.

:class:`SessionStore` is the in-process session API (``ProxyServer.sessions``) and what the HTTP
routes call. With ``queue_groups=False`` (a caller that takes each result from ``end_session``)
finished groups are not queued for :meth:`SessionStore.next_group`.

Keys: each session's ``api_key`` comes from :mod:`secrets`; the store keeps only its SHA-256 digest,
finds a session by the digest of the key presented and compares the two digests in constant time;
keys are never logged. An ended session's key is remembered (up to ``max_ended_sessions``) so that
it is refused with 401 saying the session ended or expired.

Ending (:meth:`SessionStore.end_session`): the session refuses new requests at once, waits up to
``end_drain_timeout_s`` for its requests in flight, cancels the rest, and its cache becomes a
:class:`~areal_tasks.agent.proxy.session.SessionResult` queued for :meth:`SessionStore.next_group`
(and passed to ``on_group``, e.g. the CLI's JSONL export). :meth:`SessionStore.sweep` (the
server's sweeper task) ends sessions idle or alive past their limits the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from areal_tasks.agent.proxy.errors import ProxyRefusal
from areal_tasks.agent.proxy.limits import ProxyLimits
from areal_tasks.agent.proxy.session import EndReason, Session, SessionResult, SessionState
from areal_tasks.errors import AgentError

logger = logging.getLogger(__name__)

__all__ = ["SessionStore"]

T = TypeVar("T")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _ended_message(session: Session, limits: ProxyLimits) -> str:
    reason = session.reason
    if reason is EndReason.IDLE_TIMEOUT:
        return f"session {session.id} expired: no request for more than {limits.idle_timeout_s:g} s"
    if reason is EndReason.MAX_LIFETIME:
        return f"session {session.id} expired: it passed its maximum lifetime of {limits.max_lifetime_s:g} s"
    return f"session {session.id} has ended; start a new session"


class SessionStore:
    """Every session of one proxy (see the module doc). ``make_client()`` builds a session's
    ``ArealOpenAI`` (with a fresh cache); ``on_group(result)`` is called for each finished group."""

    def __init__(
        self,
        make_client: Callable[[], Any],
        limits: ProxyLimits | None = None,
        *,
        on_group: Callable[[SessionResult], None] | None = None,
        queue_groups: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or ProxyLimits()
        self._make_client = make_client
        self._on_group = on_group
        self._queue_groups = queue_groups
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._by_digest: dict[bytes, Session] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._groups: asyncio.Queue[SessionResult] = asyncio.Queue()
        self._enders: set[asyncio.Task[Any]] = set()

    # -- sessions --------------------------------------------------------------------------------

    @property
    def open_sessions(self) -> int:
        return sum(s.state is not SessionState.ENDED for s in self._sessions.values())

    def start_session(self, client: Any = None) -> tuple[str, str]:
        """A new session: ``(session_id, api_key)``; 429 ProxyRefusal past ``max_open_sessions``.
        ``client`` (in-process callers only) is the session's own ``ArealOpenAI``, e.g. bound to an
        episode's engine; by default ``make_client()`` builds one."""
        if self.open_sessions >= self.limits.max_open_sessions:
            raise ProxyRefusal(
                429,
                f"{self.limits.max_open_sessions} sessions are open, this proxy's limit; end one first",
                code="too_many_sessions",
            )
        session_id = f"sess-{secrets.token_hex(12)}"
        key = f"sk-areal-{secrets.token_urlsafe(32)}"
        now = self._clock()
        session = Session(session_id, _digest(key), client or self._make_client(), created=now, last_active=now)
        self._sessions[session_id] = session
        self._by_digest[session.key_digest] = session
        logger.info("session %s started", session_id)
        return session_id, key

    def get(self, session_id: str) -> Session:
        """The session ``session_id`` (open or remembered); 404 ProxyRefusal otherwise."""
        session = self._sessions.get(session_id)
        if session is None:
            raise ProxyRefusal(404, f"no session {session_id!r}", param="session_id", code="session_not_found")
        return session

    def authenticate(self, key: str | None) -> Session:
        """The open session whose key is ``key``; 401 ProxyRefusal (saying why) otherwise."""
        if not key:
            raise ProxyRefusal(
                401, "missing API key: send 'Authorization: Bearer <session api_key>'", code="invalid_api_key"
            )
        digest = _digest(key)
        session = self._by_digest.get(digest)
        if session is None or not secrets.compare_digest(session.key_digest, digest):
            raise ProxyRefusal(401, "invalid API key", code="invalid_api_key")
        if session.state is not SessionState.OPEN:
            raise ProxyRefusal(401, _ended_message(session, self.limits), code="session_ended")
        return session

    def status(self, session_id: str) -> dict[str, Any]:
        """``GET /rl/sessions/{id}``."""
        return self.get(session_id).status(self._clock())

    # -- requests --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def request(self, session: Session) -> AsyncIterator[None]:
        """Hold one of ``session``'s request slots (429 past its limits) while the body runs."""
        limits = self.limits
        if session.state is not SessionState.OPEN:
            raise ProxyRefusal(401, _ended_message(session, limits), code="session_ended")
        if session.in_flight >= limits.max_concurrent_requests:
            raise ProxyRefusal(
                429,
                f"session {session.id} has {session.in_flight} requests in flight, its limit; wait for one",
                code="too_many_requests",
                retry_after_s=1.0,
            )
        if len(session.cache) >= limits.max_interactions:
            raise ProxyRefusal(
                429,
                f"session {session.id} recorded {limits.max_interactions} completions, its limit; end it",
                code="too_many_interactions",
            )
        session.in_flight += 1
        session.idle.clear()
        session.last_active = self._clock()
        try:
            yield
        finally:
            session.in_flight -= 1
            session.last_active = self._clock()
            if session.in_flight == 0:
                session.idle.set()

    async def run(self, session: Session, work: Awaitable[T]) -> T:
        """``work``'s result, run as one of ``session``'s tasks: cancelled with the caller, and by
        the session's end once its drain ran out (then a 409 ProxyRefusal)."""
        task = asyncio.ensure_future(work)
        session.tasks.add(task)
        task.add_done_callback(session.tasks.discard)
        try:
            await asyncio.wait({task})
        finally:
            if not task.done():
                task.cancel()
        if task.cancelled():
            raise ProxyRefusal(409, f"session {session.id} ended while this request was generating")
        return task.result()

    # -- ending ----------------------------------------------------------------------------------

    async def end_session(
        self,
        session_id: str,
        reason: EndReason = EndReason.ENDED,
        *,
        reward: float | None = None,
        discount: float | None = None,
    ) -> SessionResult:
        """End ``session_id`` (see the module doc) and queue its group; ending an ended session
        returns its result again without queueing it twice. Once its requests finished, ``reward``
        goes to its last completion and ``discount`` (gamma) is applied to its cache."""
        session = self.get(session_id)
        if session.ending is not None:
            return await asyncio.shield(session.ending)
        session.ending = asyncio.get_running_loop().create_future()
        session.state = SessionState.ENDING
        session.reason = reason
        try:
            result = await self._drain_and_close(session, reason, reward, discount)
        except BaseException as exc:
            session.ending.set_exception(exc if isinstance(exc, Exception) else AgentError("the end was cancelled"))
            session.ending.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        session.ending.set_result(result)
        return result

    async def _drain_and_close(
        self, session: Session, reason: EndReason, reward: float | None, discount: float | None
    ) -> SessionResult:
        try:
            await asyncio.wait_for(session.idle.wait(), self.limits.end_drain_timeout_s)
        except asyncio.TimeoutError:
            logger.warning(
                "session %s: %d requests still running %g s after its end; cancelling them",
                session.id,
                len(session.tasks),
                self.limits.end_drain_timeout_s,
            )
            for task in list(session.tasks):
                task.cancel()
            await asyncio.gather(*session.tasks, return_exceptions=True)
        cache = session.cache
        if reward is not None and len(cache):
            cache.set_last_reward(reward)
        elif reward is not None:
            logger.warning("session %s ended with reward %g but no completion to give it to", session.id, reward)
        if discount is not None:
            try:
                cache.apply_discount(discount)
            except AgentError as exc:
                logger.warning("session %s: the discount at its end was not applied: %s", session.id, exc)
        result = SessionResult(session.id, reason, cache, session.created_wall, time.time())
        session.interactions = len(cache)
        session.client = None
        session.state = SessionState.ENDED
        self._remember_ended(session.id)
        logger.info("session %s ended (%s) with %d completions", session.id, reason.value, len(cache))
        if self._queue_groups:
            self._groups.put_nowait(result)
        if self._on_group is not None:
            try:
                self._on_group(result)
            except Exception:  # the group is queued all the same; the export failure is logged
                logger.exception("session %s: exporting its group failed", session.id)
        return result

    def _remember_ended(self, session_id: str) -> None:
        self._ended[session_id] = None
        while len(self._ended) > self.limits.max_ended_sessions:
            old, _ = self._ended.popitem(last=False)
            forgotten = self._sessions.pop(old)
            self._by_digest.pop(forgotten.key_digest, None)

    async def next_group(self, timeout: float | None = None) -> SessionResult | None:
        """The next finished session's result, waiting up to ``timeout`` seconds (None: forever);
        None when none finished in time."""
        if timeout is None:
            return await self._groups.get()
        try:
            return await asyncio.wait_for(self._groups.get(), max(0.0, timeout))
        except asyncio.TimeoutError:
            return None

    # -- expiry ----------------------------------------------------------------------------------

    def expired(self) -> list[tuple[str, EndReason]]:
        """Open sessions past their lifetime, or idle (nothing in flight) past the idle timeout."""
        now, limits = self._clock(), self.limits
        found = []
        for session in self._sessions.values():
            if session.state is not SessionState.OPEN:
                continue
            if now - session.created > limits.max_lifetime_s:
                found.append((session.id, EndReason.MAX_LIFETIME))
            elif session.in_flight == 0 and now - session.last_active > limits.idle_timeout_s:
                found.append((session.id, EndReason.IDLE_TIMEOUT))
        return found

    def sweep(self) -> list[str]:
        """Start ending every expired session (each in its own task); their ids."""
        ids = []
        for session_id, reason in self.expired():
            logger.info("session %s expired (%s)", session_id, reason.value)
            task = asyncio.ensure_future(self.end_session(session_id, reason))
            self._enders.add(task)
            task.add_done_callback(self._enders.discard)
            ids.append(session_id)
        return ids

    async def close(self) -> None:
        """End every open session (reason ``server_stopped``); their groups are queued as usual."""
        await asyncio.gather(*self._enders, return_exceptions=True)
        open_ids = [s.id for s in self._sessions.values() if s.state is SessionState.OPEN]
        await asyncio.gather(*(self.end_session(i, EndReason.SERVER_STOPPED) for i in open_ids))
