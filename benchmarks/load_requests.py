"""The request mix of the server load test (``server_load.py``): valid work and hostile input.

Each :class:`Kind` sends one request of its class and reports the HTTP status (None when the client
itself gave up: the disconnect class) and the ``Retry-After`` header. ``expect`` is what a hardened
server must answer: valid requests 200 (or 429 with ``Retry-After`` when the server is full), every
invalid one a 4xx, never a 5xx and never a 2xx. The shares add up to 1: about half valid
``/generate``, a tenth valid chat, the rest invalid or abusive. Classes that break their connection
on purpose (bodies the server refuses unread, clients that hang up) or need many connections (the
flood) get a connection pool of their own, so a valid request never inherits a half-closed
keep-alive connection from them.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["KINDS", "Kind", "LoadContext", "Outcome", "valid_generate_body"]

#: tokens each valid request generates (greedy, EOS ignored: fixed work per request).
NEW_TOKENS = 16
#: requests of one flood, sent at once: more than the default queue bound (8 per KV slot, 32 slots).
FLOOD = 320


@dataclass(frozen=True)
class LoadContext:
    """What the requests need to know about the server under test."""

    url: str
    admin_key: str
    model_dir: str
    garbage_dir: str
    context_length: int
    vocab: int = 1000


@dataclass(frozen=True)
class Outcome:
    status: int | None
    retry_after: str | None = None


Send = Callable[[httpx.AsyncClient, LoadContext, random.Random], Awaitable[Outcome]]


@dataclass(frozen=True)
class Kind:
    """One request class: its share of the mix, what it must get back, how it is sent."""

    name: str
    share: float
    valid: bool
    expect: str  # "ok" (200, or 429 when full), "4xx", "gone" (the client disconnects)
    send: Send
    #: run on a connection pool of its own (see the module docstring).
    own_client: bool = False


def _prompt(rng: random.Random, ctx: LoadContext, length: int = 12) -> list[int]:
    return [rng.randrange(3, ctx.vocab) for _ in range(length)]


def valid_generate_body(rng: random.Random, ctx: LoadContext, new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    """A valid ``/generate`` body: a short random prompt, greedy, ``new_tokens`` tokens."""
    return {
        "input_ids": _prompt(rng, ctx),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True},
    }


async def _post(client: httpx.AsyncClient, url: str, body: Any, **kw: Any) -> Outcome:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    response = await client.post(url, content=content, headers=headers, **kw)
    return Outcome(response.status_code, response.headers.get("retry-after"))


def _sampling(**params: Any) -> Send:
    async def send(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
        body = valid_generate_body(rng, ctx)
        body["sampling_params"].update(params)
        return await _post(client, f"{ctx.url}/generate", body)

    return send


async def _valid_generate(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    return await _post(client, f"{ctx.url}/generate", valid_generate_body(rng, ctx))


async def _valid_chat(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"What is {rng.randrange(99)} plus {rng.randrange(99)}?"}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0.0,
    }
    return await _post(client, f"{ctx.url}/v1/chat/completions", body)


async def _big_body(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    body = {"input_ids": [5] * (3 * 1024 * 1024), "sampling_params": {"max_new_tokens": 1}}  # ~9 MiB of JSON
    return await _post(client, f"{ctx.url}/generate", body)


async def _huge_text(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    body = {"text": "lorem ipsum " * (10 * 1024 * 1024 // 12), "sampling_params": {"max_new_tokens": 1}}
    return await _post(client, f"{ctx.url}/generate", body)


async def _over_context(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    body = {"input_ids": _prompt(rng, ctx, ctx.context_length + 8), "sampling_params": {"max_new_tokens": 4}}
    return await _post(client, f"{ctx.url}/generate", body)


async def _template(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "chat_template_kwargs": {"chat_template": loop},
    }
    return await _post(client, f"{ctx.url}/v1/chat/completions", body)


async def _admin_without_key(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    return await _post(client, f"{ctx.url}/pause_generation", {})


def _weights_from(path_of: Callable[[LoadContext], str]) -> Send:
    async def send(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
        headers = {"Authorization": f"Bearer {ctx.admin_key}"}
        return await _post(client, f"{ctx.url}/update_weights_from_disk", {"model_path": path_of(ctx)}, headers=headers)

    return send


async def _disconnect(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    body = valid_generate_body(rng, ctx, new_tokens=max(16, ctx.context_length - 32))
    try:
        await asyncio.wait_for(_post(client, f"{ctx.url}/generate", body), timeout=0.2)
    except (TimeoutError, asyncio.TimeoutError):
        return Outcome(None)
    return Outcome(200)  # finished within 0.2 s: nothing was abandoned


async def _flood(client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> Outcome:
    """:data:`FLOOD` valid requests at once from one client: 429 (with its Retry-After) when any was
    refused, else the worst status of the burst."""
    outcomes = await asyncio.gather(*(_valid_generate(client, ctx, rng) for _ in range(FLOOD)))
    refused = [o for o in outcomes if o.status == 429]
    if refused:
        return refused[0]
    return max(outcomes, key=lambda o: o.status or 0)


KINDS: list[Kind] = [
    Kind("valid_generate", 0.52, True, "ok", _valid_generate),
    Kind("valid_chat", 0.10, True, "ok", _valid_chat),
    Kind("bad_types", 0.04, False, "4xx", _sampling(temperature="hot", top_k="x")),
    Kind("unknown_field", 0.04, False, "4xx", _sampling(frobnicate=1)),
    Kind("n_over_limit", 0.03, False, "4xx", _sampling(n=20000)),
    Kind("body_over_limit", 0.02, False, "4xx", _big_body, own_client=True),
    Kind("huge_text", 0.02, False, "4xx", _huge_text, own_client=True),
    Kind("prompt_over_context", 0.04, False, "4xx", _over_context),
    Kind("template_kwargs", 0.04, False, "4xx", _template),
    Kind("admin_without_key", 0.04, False, "4xx", _admin_without_key),
    Kind("garbage_weights", 0.03, False, "4xx", _weights_from(lambda ctx: ctx.garbage_dir)),
    Kind("path_escape", 0.03, False, "4xx", _weights_from(lambda ctx: f"{ctx.model_dir}/../../../../etc")),
    Kind("disconnect", 0.04, False, "gone", _disconnect, own_client=True),
    Kind("flood", 0.01, False, "ok", _flood, own_client=True),
]
