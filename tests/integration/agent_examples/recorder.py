"""A recording forwarder for the agent tests: an HTTP server in front of an OpenAI-compatible one.

Every ``/v1/...`` request is forwarded upstream as is, except for the fields in ``overrides``
(e.g. ``temperature: 0`` for a deterministic test); the request bodies as the client sent them and
the upstream's JSON answers are kept, in order, in :attr:`Recorder.requests` / ``responses``. So a
test sees exactly what an SDK put on the wire, whatever process it ran in.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


class Recorder:
    """``with Recorder(upstream) as rec: ... rec.url ...``: serves on 127.0.0.1, a free port."""

    def __init__(self, upstream: str, overrides: dict[str, Any] | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.overrides = dict(overrides or {})
        self.requests: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        app = Starlette(routes=[Route("/v1/{path:path}", self._forward, methods=["GET", "POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        if request.method == "POST":
            payload = json.loads(body)
            self.requests.append(payload)
            body = json.dumps({**payload, **self.overrides}).encode()
        headers = {"content-type": "application/json", "authorization": request.headers.get("authorization", "")}
        async with httpx.AsyncClient(timeout=120.0) as client:
            answer = await client.request(
                request.method, f"{self.upstream}/v1/{request.path_params['path']}", content=body, headers=headers
            )
        if request.method == "POST":
            self.responses.append(answer.json())
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    def __enter__(self) -> Recorder:
        self._thread.start()
        deadline = time.monotonic() + 30.0
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the recording forwarder did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30.0)
