"""``/generate`` as a bare ASGI route in front of FastAPI's: the RL client's hot path without the
framework's work per request.

Every rollout sequence is one ``/generate`` call, and the server's HTTP handling shares the
interpreter lock with the engine thread, so each call's host time is taken from the decode loop.
FastAPI's request handler (the ``Request`` object, two ``AsyncExitStack`` frames, dependency
solving, ``json.loads`` then validating the dict) cost about a quarter of the event loop's
interpreter-lock samples under a burst of calls (py-spy ``--gil``, ``docs/embedded_server.md``).

:class:`GenerateRoute` serves a ``POST``/``PUT`` whose ``Content-Type`` is ``application/json``:
it reads the body (through the body-limit middleware's counting ``receive``), validates it with
``GenerateReqInput.model_validate_json`` (pydantic parses and validates the bytes in one pass) and
awaits the same ``answer`` coroutine as the FastAPI route, watching for the client's disconnect as
that route does (``disconnect.py``). Anything else, a body that does not validate, any other
content type, is handed to the FastAPI route with the body replayed, so every refusal, its status
and its message, is the framework route's. Errors the answer raises reach the app's exception
handlers as before: the route sits inside every middleware (API keys, body limit, errors).
:func:`install_generate_route` puts it first in the router, ahead of the routes a lookup would
otherwise try before ``/generate``; the FastAPI route stays in the OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.disconnect import CLIENT_GONE, run_while_connected
from areal_tasks.inference.server.protocol import GenerateReqInput

__all__ = ["GENERATE_PATH", "GenerateRoute", "install_generate_route", "is_json_request"]

GENERATE_PATH = "/generate"
_METHODS = ("POST", "PUT")

#: ``answer(request)``: the response to one validated ``/generate`` body.
Answer = Callable[[GenerateReqInput], Awaitable[Response]]


def is_json_request(scope: Scope) -> bool:
    """Whether the request's ``Content-Type`` is exactly ``application/json`` (parameters such as
    ``charset`` allowed, case ignored); any other type takes the framework's route and its rules."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


async def read_body(receive: Receive) -> bytes:
    """The whole request body from ``receive``'s ``http.request`` messages (a disconnect first ends
    it early: the answer's own disconnect watch then sees the client gone)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` as one message, then whatever ``receive`` yields."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class GenerateRoute:
    """The ASGI app of the fast ``/generate`` route (see the module doc): ``answer`` for a JSON body
    that validates, ``fallback`` (the FastAPI route) for everything else."""

    def __init__(self, answer: Answer, fallback: APIRoute) -> None:
        self.answer = answer
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_json_request(scope):
            await self._fall_back(scope, receive, send)
            return
        body = await read_body(receive)
        try:
            req = GenerateReqInput.model_validate_json(body)
        except ValidationError:  # not JSON, not an object, a wrong field: the framework's refusal
            await self._fall_back(scope, replayed(body, receive), send)
            return
        connected, response = await run_while_connected(receive, self.answer(req))
        await (response if connected and response is not None else Response(status_code=CLIENT_GONE))(
            scope, receive, send
        )

    async def _fall_back(self, scope: Scope, receive: Receive, send: Send) -> None:
        match, child_scope = self.fallback.matches(scope)
        if match is Match.NONE:  # never: both routes answer the same path and methods
            raise InferenceError(f"the FastAPI route {GENERATE_PATH} does not match {scope['method']} {scope['path']}")
        scope.update(child_scope)
        await self.fallback.handle(scope, receive, send)


def install_generate_route(app: FastAPI, answer: Answer) -> Route:
    """Put a :class:`GenerateRoute` first in ``app``'s router, in front of the FastAPI route for
    ``/generate`` (which must exist: it serves the fallbacks and the schema); returns the route."""
    fallback = next(
        (r for r in app.router.routes if isinstance(r, APIRoute) and r.path == GENERATE_PATH),
        None,
    )
    if fallback is None:
        raise InferenceError(f"install_generate_route needs the FastAPI route {GENERATE_PATH} registered first")
    route = Route(GENERATE_PATH, endpoint=GenerateRoute(answer, fallback), methods=list(_METHODS))
    app.router.routes.insert(0, route)
    return route
