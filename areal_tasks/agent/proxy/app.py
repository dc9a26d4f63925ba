"""The proxy's FastAPI application: routes, the body limit, and every failure in OpenAI's error shape.

Routes live in ``routes_openai.py`` (``/v1``) and ``routes_rl.py`` (``/rl``); this module adds
``GET /health`` (always open) and maps exceptions to answers:

* :class:`ProxyRefusal`: its status (401, 404, 409, 413, 429 with ``Retry-After``...);
* :class:`~areal_tasks.errors.AgentRequestError` (the core client refused the request): 400
  naming the field in ``param``;
* :class:`~areal_tasks.errors.InferenceError` (the inference servers failed): 502;
* anything else: 500, logged with its traceback.

None of these touches the session: it stays open and usable after a failed request.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from areal_tasks.agent.proxy.auth import AdminAuth
from areal_tasks.agent.proxy.errors import ProxyRefusal, error_body
from areal_tasks.agent.proxy.store import SessionStore
from areal_tasks.errors import AgentRequestError, InferenceError
from areal_tasks.inference.server.body_limit import BodyLimitMiddleware

logger = logging.getLogger(__name__)

__all__ = ["ProxyContext", "create_app", "error_response", "json_body"]


@dataclass
class ProxyContext:
    """What the routes share: the sessions, the admin key and the served model's name."""

    store: SessionStore
    admin: AdminAuth
    model_name: str


def error_response(
    message: str, status: int, param: str | None = None, code: str | None = None, retry_after_s: float | None = None
) -> JSONResponse:
    """An error answer in OpenAI's shape."""
    headers = None if retry_after_s is None else {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    return JSONResponse(error_body(message, status, param, code), status_code=status, headers=headers)


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object body; 400 ProxyRefusal when it is not one."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ProxyRefusal(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProxyRefusal(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def create_app(ctx: ProxyContext) -> FastAPI:
    """The application of one proxy."""
    from areal_tasks.agent.proxy.routes_openai import openai_router
    from areal_tasks.agent.proxy.routes_rl import rl_router

    app = FastAPI(title="areal agent proxy", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.proxy = ctx
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=ctx.store.limits.max_body_bytes,
        holder="proxy",
        error_body=error_body,
        refusal=ProxyRefusal,
    )
    app.include_router(openai_router(ctx))
    app.include_router(rl_router(ctx))

    @app.exception_handler(ProxyRefusal)
    async def refused(_: Request, exc: ProxyRefusal) -> JSONResponse:
        return error_response(str(exc), exc.status, exc.param, exc.code, exc.retry_after_s)

    @app.exception_handler(RequestValidationError)
    async def invalid_parameter(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        loc = [str(p) for p in (errors[0].get("loc", ()) if errors else ()) if p not in ("body", "query", "path")]
        message = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', 'invalid')}" for e in errors[:3])
        return error_response(f"invalid request: {message}", 400, ".".join(loc) or None)

    @app.exception_handler(AgentRequestError)
    async def bad_request(_: Request, exc: AgentRequestError) -> JSONResponse:
        return error_response(str(exc), 400, exc.param)

    @app.exception_handler(InferenceError)
    async def inference_failed(request: Request, exc: InferenceError) -> JSONResponse:
        logger.warning("%s %s: the inference servers failed: %s", request.method, request.url.path, exc)
        return error_response(f"the inference servers failed: {exc}", 502)

    @app.exception_handler(Exception)
    async def failed(_: Request, exc: Exception) -> JSONResponse:
        # Starlette's outermost middleware answers with this, then re-raises: uvicorn logs the traceback
        return error_response(f"the proxy failed: {type(exc).__name__}: {exc}", 500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "open_sessions": ctx.store.open_sessions}

    return app
