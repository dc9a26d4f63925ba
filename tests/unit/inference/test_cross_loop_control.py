"""The client's controls on another event loop than its requests (``control_from_any_loop``): a
pause sent from one loop holds the requests of every loop until the resume, as the rollout
executor's control loop needs (``areal_tasks/rollout/control_loop.py``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.inference.client import RemoteInferenceEngine
from areal_tasks.inference.client.config import ClientConfig
from areal_tasks.inference.registry import make_adapter

ADDRESS = "http://127.0.0.1:1"


class Server:
    """A thread-agnostic fake SGLang server: answers at once, records the paths it was sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def handle(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.paths.append(request.url.path)
        if request.url.path in ("/pause_generation", "/continue_generation"):
            return httpx.Response(200, json={"status": "ok"})
        body = json.loads(request.content)
        n = body["sampling_params"]["max_new_tokens"]
        meta = {
            "id": body["rid"],
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": 1,
            "completion_tokens": n,
            "cached_tokens": 0,
            "output_token_logprobs": [[-1.0, 5, None]] * n,
            "weight_version": "0",
        }
        return httpx.Response(200, json={"text": "", "output_ids": [5] * n, "meta_info": meta})

    def generates(self) -> int:
        with self.lock:
            return self.paths.count("/generate")


@pytest.fixture
def episodes_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread of its own: the loop the requests run on."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_a_pause_on_one_loop_holds_the_requests_of_another_until_the_resume(episodes_loop):
    server = Server()
    engine = RemoteInferenceEngine(
        [ADDRESS],
        make_adapter("sglang"),
        ClientConfig(max_retries=0),
        transport_factory=lambda: httpx.MockTransport(server.handle),
    )
    assert engine.control_from_any_loop

    def generate() -> asyncio.Future:
        req = ModelRequest([1], SamplingParams(max_new_tokens=3))
        return asyncio.run_coroutine_threadsafe(engine.agenerate(req), episodes_loop)

    assert generate().result(10).output_ids == [5, 5, 5]  # the episodes' loop is known to the engine
    asyncio.run(engine.pause("abort"))  # another loop: this thread's
    held = generate()
    wait_for(lambda: any(r.held for r in engine.inflight()), "the request to be held")
    assert server.generates() == 1 and not held.done()  # nothing reached the paused server
    asyncio.run(engine.resume())
    assert held.result(10).output_ids == [5, 5, 5]
    assert server.generates() == 2
    asyncio.run_coroutine_threadsafe(engine.aclose(), episodes_loop).result(10)


def test_a_loop_first_seen_during_a_pause_starts_held_and_a_closed_loop_is_skipped():
    server = Server()
    engine = RemoteInferenceEngine(
        [ADDRESS],
        make_adapter("sglang"),
        ClientConfig(max_retries=0),
        transport_factory=lambda: httpx.MockTransport(server.handle),
    )
    asyncio.run(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=1))))  # a loop, now closed
    asyncio.run(engine.pause("in_place"))  # the closed loop's gate cannot change: skipped, not an error

    async def late_request() -> bool:
        task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=1))))
        for _ in range(100):
            await asyncio.sleep(0)
        return task.done()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(late_request()) is False  # held from the start
        assert server.generates() == 1
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
