"""The bare ``/generate`` route (``generate_route.py``) answers exactly as the FastAPI route it sits
in front of: the same status and body for every body, valid or not, whatever its content type and
however it arrives; JSON bodies that validate skip the framework, the rest reach it replayed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from areal_tasks.inference.server.app import create_app
from areal_tasks.inference.server.generate_route import GENERATE_PATH, GenerateRoute, is_json_request
from areal_tasks.inference.server.service import EmbeddedServer

JSON = "application/json"
VALID = b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}'

#: (name, body bytes, content type or None): bodies the two routes must answer alike.
BODIES: list[tuple[str, bytes, str | None]] = [
    ("valid", VALID, JSON),
    ("valid-charset", VALID, "application/json; charset=utf-8"),
    ("valid-upper-case-type", VALID, "Application/JSON"),
    ("valid-json-suffix-type", VALID, "application/vnd.api+json"),
    ("valid-batch", b'{"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}', JSON),
    ("valid-extra-key", b'{"input_ids": [1], "sampling_params": {"temperature": 0}, "session_id": "x"}', JSON),
    ("valid-duplicate-key", b'{"input_ids": "x", "input_ids": [4, 5], "sampling_params": {"temperature": 0}}', JSON),
    ("valid-utf16", VALID.decode().encode("utf-16"), JSON),
    ("no-content-type", VALID, None),
    ("text-plain", VALID, "text/plain"),
    ("form", b"input_ids=1", "application/x-www-form-urlencoded"),
    ("wrong-type", b'{"input_ids": ["1", "2"]}', JSON),
    ("bool-as-int", b'{"input_ids": [true, false]}', JSON),
    ("float-as-int", b'{"input_ids": [1.0]}', JSON),
    ("nan-literal", b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}', JSON),
    ("huge-int", b'{"input_ids": [1' + b"0" * 400 + b"]}", JSON),
    ("array-body", b"[1, 2, 3]", JSON),
    ("string-body", b'"hello"', JSON),
    ("null-body", b"null", JSON),
    ("empty-body", b"", JSON),
    ("truncated", VALID[:-5], JSON),
    ("invalid-utf8", b'{"text": "\xff\xfe"}', JSON),
    ("both-prompts", b'{"text": "hi", "input_ids": [1]}', JSON),
    ("neither-prompt", b'{"sampling_params": {"max_new_tokens": 1}}', JSON),
    ("stream", b'{"input_ids": [1], "stream": true}', JSON),
    ("refused-field", b'{"input_ids": [1], "lora_path": "x"}', JSON),
]


def _framework_only(server: EmbeddedServer) -> Any:
    """The app without the bare route: FastAPI's ``/generate`` alone, as before it existed."""
    app = create_app(server)
    app.router.routes[:] = [r for r in app.router.routes if not isinstance(getattr(r, "app", None), GenerateRoute)]
    return app


async def _post(app: Any, body: bytes | AsyncIterator[bytes], content_type: str | None) -> httpx.Response:
    headers = {} if content_type is None else {"content-type": content_type}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://server", timeout=60) as http:
        return await http.post(GENERATE_PATH, content=body, headers=headers)


def _comparable(response: httpx.Response) -> Any:
    """The answer without what differs from call to call (request ids, timings)."""
    try:
        payload = response.json()
    except ValueError:
        return response.status_code, response.text
    if response.status_code != 200:  # a refusal may name the request's generated id
        return response.status_code, re.sub(r"request [0-9a-f]{32}", "request <rid>", response.text)
    answers = payload if isinstance(payload, list) else [payload]
    return 200, [(a["output_ids"], a["meta_info"]["finish_reason"]) for a in answers]


@pytest.mark.parametrize("name, body, content_type", BODIES, ids=[b[0] for b in BODIES])
def test_the_bare_route_answers_as_the_framework_route(server, name, body, content_type) -> None:
    async def both() -> tuple[httpx.Response, httpx.Response]:
        return await _post(create_app(server), body, content_type), await _post(
            _framework_only(server), body, content_type
        )

    fast, framework = asyncio.run(both())
    assert _comparable(fast) == _comparable(framework), (fast.text, framework.text)
    assert (fast.status_code == 200) == name.startswith("valid"), fast.text


def test_only_json_bodies_that_validate_skip_the_framework(server) -> None:
    app = create_app(server)
    route = app.router.routes[0]
    assert isinstance(route, Route) and isinstance(route.app, GenerateRoute), "the bare route is looked up first"
    fallbacks: list[str] = []
    original = route.app._fall_back

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        fallbacks.append(scope["path"])
        await original(scope, receive, send)

    route.app._fall_back = counted  # type: ignore[method-assign]

    async def calls() -> list[int]:
        return [
            (await _post(app, VALID, JSON)).status_code,
            (await _post(app, b'{"input_ids": ["x"]}', JSON)).status_code,
            (await _post(app, VALID, "text/plain")).status_code,
        ]

    assert asyncio.run(calls()) == [200, 400, 400]
    assert fallbacks == [GENERATE_PATH, GENERATE_PATH], "the valid JSON body never reached the framework route"


def test_a_body_sent_in_chunks_is_read_whole(server) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(VALID), 7):
            yield VALID[start : start + 7]

    async def call() -> httpx.Response:
        return await _post(create_app(server), chunks(), JSON)

    response = asyncio.run(call())
    assert response.status_code == 200 and len(response.json()["output_ids"]) == 2, response.text


def test_the_framework_route_stays_in_the_schema_and_other_methods_are_refused(server) -> None:
    app = create_app(server)

    async def calls() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as http:
            return await http.get("/openapi.json"), await http.get(GENERATE_PATH)

    schema, get = asyncio.run(calls())
    assert set(schema.json()["paths"][GENERATE_PATH]) == {"post", "put"}
    assert get.status_code == 405 and "POST" in get.headers["allow"], get.text


@pytest.mark.parametrize(
    "headers, expected",
    [
        ([(b"content-type", b"application/json")], True),
        ([(b"host", b"x"), (b"content-type", b" APPLICATION/JSON ; charset=utf-8")], True),
        ([(b"content-type", b"application/jsonx")], False),
        ([(b"content-type", b"text/json")], False),
        ([], False),
    ],
)
def test_is_json_request(headers, expected) -> None:
    assert is_json_request({"headers": headers}) is expected
