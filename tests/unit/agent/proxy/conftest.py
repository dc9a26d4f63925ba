"""Fixtures of the proxy's unit tests: a :class:`ProxyServer` over a scripted engine, on its own loop.

:class:`PromptEngine` answers from the prompt's last user turn, so that tests sharing one proxy do
not depend on each other's order: ``TOOL`` -> a Hermes tool call, ``FAIL`` -> an InferenceError,
``HOLD`` -> waits for :attr:`PromptEngine.release` (a generation a test can leave mid-way), anything
else -> ``"hello there"``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from areal_tasks.agent.proxy.limits import ProxyLimits
from areal_tasks.agent.proxy.server import ProxyServer
from areal_tasks.api.inference import ModelRequest, ModelResponse, SamplingParams
from areal_tasks.errors import InferenceError
from tests.unit.agent.fakes import FakeEngine, Reply, call_text
from tests.unit.agent.proxy.proxy_thread import ProxyThread
from tests.unit.rollout.workflow_fakes import tiny_tokenizer

ADMIN_KEY = "admin-test-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TOOL_CALL = call_text(("add", '{"a": 1, "b": 2}'))


class PromptEngine(FakeEngine):
    """A FakeEngine whose reply depends on the prompt (see the module doc)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, [Reply("hello there")])
        self.release = threading.Event()
        self.held = 0
        self.cancelled = 0

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        prompt = self.tokenizer.decode(req.input_ids)
        last_user = prompt.rsplit("user", 1)[-1]
        if "FAIL" in last_user:
            raise InferenceError("the scripted server failed")
        if "HOLD" in last_user:
            self.held += 1
            try:
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        self.script = [Reply(TOOL_CALL if "TOOL" in last_user else "hello there")]
        self.requests.clear()  # the script's first reply, every time
        return await super().agenerate(req)


def make_proxy(limits: ProxyLimits, **kwargs: Any) -> ProxyThread:
    tokenizer = tiny_tokenizer()

    def build() -> ProxyServer:
        engine = PromptEngine(tokenizer)
        return ProxyServer(
            engine,
            tokenizer,
            admin_api_key=ADMIN_KEY,
            sampling=SamplingParams(max_new_tokens=32),
            limits=limits,
            **kwargs,
        )

    return ProxyThread(build)


@pytest.fixture(scope="module")
def proxy() -> Iterator[ProxyThread]:
    limits = ProxyLimits(max_concurrent_requests=2, max_interactions=6, max_body_bytes=64 * 1024, end_drain_timeout_s=2)
    with make_proxy(limits) as running:
        yield running


@pytest.fixture
def engine(proxy: ProxyThread) -> Iterator[PromptEngine]:
    assert proxy.server is not None
    engine = proxy.server.engine
    engine.release.clear()
    yield engine
    engine.release.set()


def start_session(url: str) -> tuple[str, str]:
    """A new session over HTTP: ``(session_id, api_key)``."""
    answer = httpx.post(f"{url}/rl/start_session", headers=ADMIN, timeout=30)
    answer.raise_for_status()
    body = answer.json()
    return body["session_id"], body["api_key"]
