"""The session store without HTTP: keys, limits, expiry on a fake clock, ending (drain, then cancel),
the group queue, and ``ProxyLimits``' checks; plus idle expiry through a running proxy's sweeper."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import openai
import pytest

from areal_tasks.agent.interactions import InteractionCache
from areal_tasks.agent.proxy.errors import ProxyRefusal
from areal_tasks.agent.proxy.limits import ProxyLimits
from areal_tasks.agent.proxy.session import EndReason
from areal_tasks.agent.proxy.store import SessionStore
from areal_tasks.errors import ConfigError
from tests.unit.agent.proxy.conftest import ADMIN, make_proxy, start_session


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_client() -> SimpleNamespace:
    return SimpleNamespace(cache=InteractionCache())


def store(clock: Clock | None = None, **limits: object) -> SessionStore:
    return SessionStore(fake_client, ProxyLimits(**limits), clock=clock or Clock())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_concurrent_requests", 0),
        ("idle_timeout_s", float("inf")),
        ("max_body_bytes", True),
        ("max_lifetime_s", -1),
    ],
)
def test_limits_are_checked_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"ProxyLimits.{field}="):
        ProxyLimits(**{field: value})


def test_keys_are_per_session_and_ended_or_expired_keys_say_why() -> None:
    async def scenario() -> None:
        clock = Clock()
        sessions = store(clock, idle_timeout_s=10, max_lifetime_s=100)
        a, key_a = sessions.start_session()
        b, key_b = sessions.start_session()
        assert key_a != key_b and key_a.startswith("sk-areal-") and len(key_a) > 40
        assert sessions.authenticate(key_a).id == a and sessions.authenticate(key_b).id == b
        for wrong in (None, "", "sk-areal-nope", key_a + "x"):
            with pytest.raises(ProxyRefusal) as refused:
                sessions.authenticate(wrong)
            assert refused.value.status == 401
        await sessions.end_session(a)
        with pytest.raises(ProxyRefusal, match=f"session {a} has ended"):
            sessions.authenticate(key_a)
        clock.now += 11
        assert sessions.sweep() == [b]
        group = await sessions.next_group(timeout=5)
        group = await sessions.next_group(timeout=5) if group.session_id == a else group
        assert group.session_id == b and group.reason is EndReason.IDLE_TIMEOUT
        with pytest.raises(ProxyRefusal, match="expired: no request for more than 10 s"):
            sessions.authenticate(key_b)
        assert await sessions.next_group(timeout=0.01) is None

    asyncio.run(scenario())


def test_lifetime_expiry_and_busy_sessions_are_not_idle() -> None:
    async def scenario() -> None:
        clock = Clock()
        sessions = store(clock, idle_timeout_s=10, max_lifetime_s=30)
        a, _ = sessions.start_session()
        session = sessions.get(a)
        async with sessions.request(session):
            clock.now += 20  # busy for 20 s: not idle
            assert sessions.expired() == []
            clock.now += 11
            assert sessions.expired() == [(a, EndReason.MAX_LIFETIME)]

    asyncio.run(scenario())


def test_open_session_and_request_limits() -> None:
    async def scenario() -> None:
        sessions = store(max_open_sessions=2, max_concurrent_requests=1)
        a, _ = sessions.start_session()
        sessions.start_session()
        with pytest.raises(ProxyRefusal, match="2 sessions are open") as refused:
            sessions.start_session()
        assert refused.value.status == 429
        session = sessions.get(a)
        async with sessions.request(session):
            with pytest.raises(ProxyRefusal, match="in flight") as busy:
                async with sessions.request(session):
                    pass
            assert busy.value.status == 429 and busy.value.retry_after_s
        await sessions.end_session(a)
        sessions.start_session()  # an ended session frees its place

    asyncio.run(scenario())


def test_end_waits_for_requests_then_cancels_them_and_forgets_old_sessions() -> None:
    async def scenario() -> None:
        sessions = store(end_drain_timeout_s=0.2, max_ended_sessions=1)
        a, key_a = sessions.start_session()
        session = sessions.get(a)
        started = asyncio.Event()

        async def request() -> None:
            async with sessions.request(session):
                started.set()
                await sessions.run(session, asyncio.sleep(30))

        pending = asyncio.ensure_future(request())
        await started.wait()
        begun = time.monotonic()
        result = await sessions.end_session(a, reward=1.0)
        assert time.monotonic() - begun < 5 and result.reason is EndReason.ENDED
        with pytest.raises(ProxyRefusal, match="ended while this request was generating") as cut:
            await pending
        assert cut.value.status == 409
        assert await sessions.end_session(a) is result  # ending again: the same result, queued once
        assert sessions.status(a)["state"] == "ended"
        b, _ = sessions.start_session()
        await sessions.end_session(b)
        with pytest.raises(ProxyRefusal, match="no session"):
            sessions.get(a)  # forgotten past max_ended_sessions
        with pytest.raises(ProxyRefusal, match="invalid API key"):
            sessions.authenticate(key_a)

    asyncio.run(scenario())


def test_an_idle_session_expires_on_the_proxy_and_its_group_is_exported() -> None:
    # 1.5 s: in a CI run on a loaded 2-core machine 0.3 s passed between the session's start and its
    # first request (the client built in between), and the session expired before it was used
    with make_proxy(ProxyLimits(idle_timeout_s=1.5)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="pending", max_retries=0)
        session_id, key = start_session(proxy.url)
        client = client.with_options(api_key=key)
        client.chat.completions.create(model="areal", messages=[{"role": "user", "content": "hi"}])
        answer = httpx.get(f"{proxy.url}/rl/groups/next", params={"timeout": 10}, headers=ADMIN, timeout=30)
        group = answer.json()
        assert group["session_id"] == session_id and group["reason"] == "idle_timeout"
        assert group["interactions"] == 1 and len(group["trajectories"]) == 1
        with pytest.raises(openai.AuthenticationError, match="expired"):
            client.chat.completions.create(model="areal", messages=[{"role": "user", "content": "hi"}])
        assert proxy.server is not None
        sessions = proxy.server.sessions

        async def start() -> str:
            return sessions.start_session()[0]

        in_process_id = proxy.call(start())
        result = proxy.call(sessions.end_session(in_process_id))
        assert result.trajectories() == [] and proxy.call(sessions.next_group(1)).session_id == in_process_id
