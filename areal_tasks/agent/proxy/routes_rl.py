"""The proxy's session routes (``/rl``): start, reward, end, status, and the finished groups.

* ``POST /rl/start_session`` (admin) -> ``{"session_id", "api_key"}``;
* ``POST /rl/set_reward`` ``{"reward": float, "completion_id"?: str}`` under the session's key
  (or the admin key with ``"session_id"``): rewards that completion, by default the session's last;
  a completion of another session is a 404 naming only the id;
* ``POST /rl/end_session`` ``{"reward"?: float, "discount"?: gamma}`` likewise: ends the session
  (the reward goes to its last completion, the discount is applied once, both after its requests
  in flight finished) -> ``{"session_id", "reason", "interactions", "reward"}``; its key is refused
  from then on;
* ``GET /rl/sessions/{id}`` (admin): the session's state;
* ``GET /rl/groups/next?timeout=S&style=concat|individual`` (admin): pops the next finished
  session's group (``SessionResult.to_dict``), waiting up to S seconds (at most
  ``ProxyLimits.max_group_wait_s``); 204 when none finished in time. A client that leaves while it
  waits pops nothing.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from areal_tasks.agent.proxy.app import ProxyContext, json_body
from areal_tasks.agent.proxy.auth import bearer
from areal_tasks.agent.proxy.errors import ProxyRefusal
from areal_tasks.agent.proxy.session import Session, SessionState
from areal_tasks.errors import AgentError
from areal_tasks.inference.server.disconnect import CLIENT_GONE, run_while_connected
from areal_tasks.inference.server.json_answer import JsonAnswer

logger = logging.getLogger(__name__)

__all__ = ["number_field", "rl_router"]

_STYLES = ("concat", "individual")


def number_field(
    body: dict[str, Any], name: str, *, low: float | None = None, high: float | None = None
) -> float | None:
    """``body[name]`` as a finite float in [low, high], None when absent; 400 naming it otherwise."""
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (low is None or value >= low) and (high is None or value <= high):
        return float(value)
    bounds = "" if low is None else f" in [{low:g}, {high:g}]"
    raise ProxyRefusal(400, f"{name} must be a finite number{bounds}, got {value!r}", param=name)


def rl_router(ctx: ProxyContext) -> APIRouter:
    """The ``/rl`` routes of one proxy."""
    router = APIRouter()
    store = ctx.store

    def caller(request: Request, body: dict[str, Any], what: str) -> Session:
        """The session a reward/end request is about: its key's, or ``session_id`` under the admin key."""
        token = bearer(request.headers.get("authorization"))
        if "session_id" in body and ctx.admin.is_admin(token):
            session_id = body["session_id"]
            if not isinstance(session_id, str):
                raise ProxyRefusal(400, "session_id must be a string", param="session_id")
            session = store.get(session_id)
            if session.state is not SessionState.OPEN:
                raise ProxyRefusal(409, f"{what}: session {session_id} has already ended", code="session_ended")
            return session
        return store.authenticate(token)

    @router.post("/rl/start_session")
    async def start_session(request: Request) -> dict[str, str]:
        ctx.admin.require(bearer(request.headers.get("authorization")), "POST /rl/start_session")
        session_id, api_key = store.start_session()
        return {"session_id": session_id, "api_key": api_key}

    @router.post("/rl/set_reward")
    async def set_reward(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        session = caller(request, body, "set_reward")
        reward = number_field(body, "reward")
        if reward is None:
            raise ProxyRefusal(400, "reward is required", param="reward")
        completion_id = body.get("completion_id")
        cache = session.cache
        if completion_id is None:
            items = list(cache)
            if not items:
                raise ProxyRefusal(400, f"session {session.id} has no completion to reward yet", param="completion_id")
            completion_id = items[-1].id
        if not isinstance(completion_id, str):
            raise ProxyRefusal(400, "completion_id must be a string", param="completion_id")
        try:
            cache.set_reward(completion_id, reward)
        except AgentError:
            raise ProxyRefusal(
                404, f"no completion {completion_id!r} in this session", param="completion_id", code="not_found"
            ) from None
        return {"session_id": session.id, "completion_id": completion_id, "reward": reward}

    @router.post("/rl/end_session")
    async def end_session(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        session = caller(request, body, "end_session")
        reward = number_field(body, "reward")
        discount = number_field(body, "discount", low=0.0, high=1.0)
        result = await store.end_session(session.id, reward=reward, discount=discount)
        return {
            "session_id": result.session_id,
            "reason": result.reason.value,
            "interactions": len(result.cache),
            "reward": result.reward,
        }

    @router.get("/rl/sessions/{session_id}")
    async def session_status(session_id: str, request: Request) -> dict[str, Any]:
        ctx.admin.require(bearer(request.headers.get("authorization")), "GET /rl/sessions/{id}")
        return store.status(session_id)

    @router.get("/rl/groups/next")
    async def next_group(request: Request, timeout: float = 0.0, style: str = "concat") -> Response:
        ctx.admin.require(bearer(request.headers.get("authorization")), "GET /rl/groups/next")
        limit = store.limits.max_group_wait_s
        if not (math.isfinite(timeout) and 0 <= timeout <= limit):
            raise ProxyRefusal(400, f"timeout must be in [0, {limit:g}] seconds, got {timeout!r}", param="timeout")
        if style not in _STYLES:
            raise ProxyRefusal(400, f"style must be one of {_STYLES}, got {style!r}", param="style")
        connected, result = await run_while_connected(request.receive, store.next_group(timeout))
        if not connected:
            return Response(status_code=CLIENT_GONE)
        if result is None:
            return Response(status_code=204)
        return JsonAnswer(result.to_dict(style))  # type: ignore[arg-type]

    return router
