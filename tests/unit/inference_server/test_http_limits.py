"""The bounded request path, in process (ASGI) over the module's tiny engine: 413 past a limit, 429 with
``Retry-After`` for a full queue, text refused before it is tokenised, tokenising off the event loop
within a time limit, allow-listed chat-template arguments, exact aborts, a cancelled request's
sequences aborted, and ``/health`` saying what keeps the server from serving (never a pause)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from areal_tasks.inference.server.app import create_app
from areal_tasks.inference.server.disconnect import run_while_connected
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.limits import ServerLimits
from areal_tasks.inference.server.service import EmbeddedServer

PROMPT = [5, 6, 7]
SHORT = {"max_new_tokens": 2, "temperature": 0}
#: decode steps far beyond what a test waits for (it is aborted long before)
LONG = {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}


class CountingTokenizer:
    """The server's tokenizer, counting ``encode`` calls; ``gate`` (when set) holds each one, and
    each takes at least ``delay_s``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encodes = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Semaphore(0)
        self.delay_s = 0.0

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        self.encodes += 1
        time.sleep(self.delay_s)
        if self.gate is not None:
            self.entered.release()
            self.gate.wait(60)
        return self.inner.encode(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def make_server(engine: Engine) -> Iterator[Any]:
    """``make_server(**limits) -> EmbeddedServer`` over the module's engine (queue bound reset after)."""
    made: list[EmbeddedServer] = []

    def make(**limits: Any) -> EmbeddedServer:
        server = EmbeddedServer(engine, engine.runner.cfg.model_path, "tiny", limits=ServerLimits(**limits))
        server.tokenizer = CountingTokenizer(server.tokenizer)
        made.append(server)
        return server

    yield make
    for server in made:
        server.lanes.shutdown()
    engine.limit_queue(None)
    if engine.paused:
        engine.call(engine.resume).result(timeout=30)


@contextlib.asynccontextmanager
async def client(server: EmbeddedServer) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://server", timeout=60) as http:
        yield http


async def until(predicate: Any, what: str, limit_s: float = 30.0) -> None:
    """Wait (bounded) until ``predicate()`` holds."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not within {limit_s} s")
        await asyncio.sleep(0.01)


def idle(engine: Engine) -> bool:
    stats = engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0


def message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


def test_n_prompts_and_whole_requests_past_the_limits_answer_413(make_server, engine) -> None:
    server = make_server(max_n=4, max_prompts_per_request=2, max_queued_sequences=6)

    async def scenario() -> None:
        async with client(server) as http:
            too_many_samples = await http.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"n": 5}})
            assert too_many_samples.status_code == 413 and "n=5" in message(too_many_samples)
            batch = await http.post("/generate", json={"input_ids": [PROMPT] * 3, "sampling_params": SHORT})
            assert batch.status_code == 413 and "3 prompts" in message(batch)
            texts = await http.post("/generate", json={"text": ["a", "b", "c"], "sampling_params": SHORT})
            assert texts.status_code == 413 and server.tokenizer.encodes == 0  # refused before tokenising
            never_fits = await http.post(
                "/generate", json={"input_ids": [PROMPT] * 2, "sampling_params": {**SHORT, "n": 4}}
            )
            assert never_fits.status_code == 413 and "8 sequences" in message(never_fits)
            chat = await http.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": 5}
            )
            # the OpenAI routes refuse n past the server's max_n as OpenAI does: a 400 naming the field
            assert chat.status_code == 400 and chat.json()["error"]["param"] == "n" and "n=4" in message(chat)
            ok = await http.post("/generate", json={"input_ids": [PROMPT] * 2, "sampling_params": {**SHORT, "n": 3}})
            assert ok.status_code == 200 and len(ok.json()) == 6
        await until(lambda: idle(engine), "an idle engine")

    asyncio.run(scenario())


def test_a_full_queue_answers_429_with_retry_after_and_queues_nothing(make_server, engine) -> None:
    server = make_server(max_queued_sequences=4)

    async def scenario() -> None:
        async with client(server) as http:
            await asyncio.wrap_future(engine.call(lambda: engine.pause("in_place")))
            held = asyncio.create_task(
                http.post("/generate", json={"input_ids": PROMPT, "sampling_params": {**SHORT, "n": 3}})
            )
            await until(lambda: engine.stats().num_waiting == 3, "the first request queued")
            full = await http.post("/generate", json={"input_ids": PROMPT, "sampling_params": {**SHORT, "n": 2}})
            assert full.status_code == 429 and "queue is full" in message(full)
            assert 1 <= int(full.headers["Retry-After"]) <= 30
            completion = await http.post("/v1/completions", json={"prompt": [PROMPT, PROMPT], "max_tokens": 2})
            assert completion.status_code == 429 and "Retry-After" in completion.headers
            assert engine.stats().num_waiting == 3  # the refused requests queued nothing
            fits = asyncio.create_task(http.post("/generate", json={"input_ids": PROMPT, "sampling_params": SHORT}))
            await until(lambda: engine.stats().num_waiting == 4, "the request that fits queued")
            await asyncio.wrap_future(engine.call(engine.resume))
            assert (await held).status_code == 200 and (await fits).status_code == 200
        await until(lambda: idle(engine), "an idle engine")

    asyncio.run(scenario())


def test_a_body_over_the_limit_answers_413_declared_or_streamed(make_server) -> None:
    server = make_server(max_body_bytes=1000)
    body = b'{"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}}'
    padded = body[:-1] + b' , "pad": "' + b"x" * 2000 + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(padded), 100):
            yield padded[start : start + 100]

    async def scenario() -> None:
        async with client(server) as http:
            headers = {"content-type": "application/json"}
            declared = await http.post("/generate", content=padded, headers=headers)
            assert declared.status_code == 413 and "1000 bytes" in message(declared)
            streamed = await http.post("/generate", content=chunks(), headers=headers)
            assert "content-length" not in streamed.request.headers
            assert streamed.status_code == 413 and "1000 bytes" in message(streamed)
            assert (await http.post("/generate", content=body, headers=headers)).status_code == 200

    asyncio.run(scenario())


def test_the_frameworks_own_refusals_answer_in_the_error_shape(make_server) -> None:
    """A body that is not text (invalid UTF-8), an unknown path and a wrong method answer in
    OpenAI's error shape like every other refusal, the first naming what to send instead."""
    server = make_server()

    async def scenario() -> None:
        async with client(server) as http:
            headers = {"content-type": "application/json"}
            for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                garbled = await http.post(path, content=b'{"prompt": "\xff\xfe"}', headers=headers)
                assert garbled.status_code == 400 and "UTF-8" in message(garbled)
                assert garbled.json()["error"]["type"] == "invalid_request_error"
            missing = await http.post("/v1/nothing", json={})
            assert missing.status_code == 404 and message(missing) == "Not Found"
            wrong = await http.get("/generate")
            assert wrong.status_code == 405 and "allow" in wrong.headers

    asyncio.run(scenario())


def test_text_that_cannot_fit_is_refused_before_it_is_tokenised(make_server, engine) -> None:
    server = make_server()
    longest = max(len(t) for t in engine.runner.tokenizer.get_vocab())
    # the derived bound: no tokenisation of more text can fit in the context
    assert server.limits.max_prompt_chars == engine.runner.max_len * longest * 4
    text = "a" * (server.limits.max_prompt_chars + 1)

    async def scenario() -> None:
        async with client(server) as http:
            native = await http.post("/generate", json={"text": text, "sampling_params": SHORT})
            assert native.status_code == 413 and "characters" in message(native)
            completion = await http.post("/v1/completions", json={"prompt": ["hi", text], "max_tokens": 2})
            assert completion.status_code == 413
            chat = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]})
            assert chat.status_code == 413
            assert server.tokenizer.encodes == 0
            fits = await http.post("/generate", json={"text": "hello there", "sampling_params": SHORT})
            assert fits.status_code == 200 and server.tokenizer.encodes == 1

    asyncio.run(scenario())


def test_chat_template_kwargs_are_an_allow_list_of_plain_values(make_server) -> None:
    server = make_server()
    closed = make_server(chat_template_kwargs=())
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    wedge = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"

    async def scenario() -> None:
        async with client(server) as http:
            template = await http.post(
                "/v1/chat/completions", json={**chat, "chat_template_kwargs": {"chat_template": wedge}}
            )
            assert template.status_code == 400 and "chat_template" in message(template)
            assert server.tokenizer.encodes == 0  # refused before anything was rendered
            other = await http.post("/v1/chat/completions", json={**chat, "chat_template_kwargs": {"tools": []}})
            assert other.status_code == 400
            nested = await http.post(
                "/v1/chat/completions", json={**chat, "chat_template_kwargs": {"enable_thinking": {"a": 1}}}
            )
            assert nested.status_code == 400 and "chat_template_kwargs" in message(nested)
            long = await http.post(
                "/v1/chat/completions", json={**chat, "chat_template_kwargs": {"reasoning_effort": "x" * 300}}
            )
            assert long.status_code == 400
            allowed = await http.post(
                "/v1/chat/completions", json={**chat, "chat_template_kwargs": {"enable_thinking": False}}
            )
            assert allowed.status_code == 200
        async with client(closed) as http:
            refused = await http.post(
                "/v1/chat/completions", json={**chat, "chat_template_kwargs": {"enable_thinking": False}}
            )
            assert refused.status_code == 400 and "allowed: none" in message(refused)

    asyncio.run(scenario())


def test_tokenising_runs_off_the_loop_within_its_time_limit(make_server) -> None:
    """A tokenisation past the limit is a 413 (its own work is too large), one that never got a
    thread a 429; meanwhile the loop answers, and /health names the call past its deadline."""
    server = make_server(tokenize_timeout_s=0.3)
    tokenizer = server.tokenizer
    tokenizer.gate = threading.Event()
    body = {"text": "hello", "sampling_params": SHORT}

    async def scenario() -> None:
        async with client(server) as http:
            first, second = (asyncio.create_task(http.post("/generate", json=body)) for _ in range(2))
            for _ in range(2):  # both lane threads are inside encode
                await asyncio.to_thread(tokenizer.entered.acquire, True, 30)
            assert (await http.get("/health")).status_code in (200, 503)  # the loop answers meanwhile
            queued = await http.post("/generate", json=body)
            assert queued.status_code == 429 and "Retry-After" in queued.headers
            for task in (first, second):
                slow = await task
                assert slow.status_code == 413 and "took longer than 0.3 s" in message(slow)
            health = await http.get("/health")
            assert health.status_code == 503 and "tokenize" in message(health) and "deadline" in message(health)
            tokenizer.gate.set()
            await until(lambda: not server.lanes.overdue(), "the lane calls returned")
            assert (await http.get("/health")).status_code == 200
            tokenizer.gate = None
            assert (await http.post("/generate", json=body)).status_code == 200

    asyncio.run(scenario())


def test_time_queued_for_a_tokenize_thread_does_not_count_against_a_request(make_server) -> None:
    """Four prompts of 1.2 s of tokenising each on the 2 threads under a 2 s limit: the last two
    wait 1.2 s for a thread and then run 1.2 s, each within the limit, so all four are answered
    (counting the wait, 2.4 s would have refused them as too large, a 413 no retry can mend)."""
    server = make_server(tokenize_timeout_s=2.0)
    server.tokenizer.delay_s = 1.2
    body = {"text": "hello", "sampling_params": SHORT}

    async def scenario() -> None:
        async with client(server) as http:
            answers = await asyncio.gather(*(http.post("/generate", json=body) for _ in range(4)))
            assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]

    asyncio.run(scenario())


def test_a_rid_in_flight_is_not_taken_twice(make_server, engine) -> None:
    """A request under the rid of one still in flight, or a batch naming one rid twice, is a 400
    naming ``rid`` that queues nothing (an abort by rid would stop both); the rid is free again
    once its request has finished, and a refused batch holds none of its rids."""
    server = make_server()

    async def scenario() -> None:
        async with client(server) as http:
            await asyncio.wrap_future(engine.call(lambda: engine.pause("in_place")))
            first = asyncio.create_task(
                http.post("/generate", json={"rid": "dup", "input_ids": PROMPT, "sampling_params": {**LONG, "n": 2}})
            )
            await until(lambda: engine.stats().num_waiting == 2, "the first request queued")
            again = await http.post("/generate", json={"rid": "dup", "input_ids": PROMPT, "sampling_params": SHORT})
            assert again.status_code == 400 and again.json()["error"]["param"] == "rid"
            assert "dup" in message(again)
            twice = await http.post("/generate", json={"rid": ["x", "x"], "text": ["a", "b"], "sampling_params": SHORT})
            assert twice.status_code == 400 and twice.json()["error"]["param"] == "rid"
            assert "'x' names 2 prompts of this batch" in message(twice)
            assert engine.stats().num_waiting == 2
            await asyncio.wrap_future(engine.call(engine.resume))
            assert (await first).status_code == 200
            for rid in ("dup", "x"):
                reused = await http.post("/generate", json={"rid": rid, "input_ids": PROMPT, "sampling_params": SHORT})
                assert reused.status_code == 200

    asyncio.run(scenario())


def test_abort_request_names_one_request_exactly(make_server, engine) -> None:
    """``/abort_request {}`` aborts nothing (it aborted every request); a rid aborts that request and
    its samples, not another request whose rid starts with it."""
    server = make_server()

    async def scenario() -> None:
        async with client(server) as http:
            await asyncio.wrap_future(engine.call(lambda: engine.pause("in_place")))
            mine = asyncio.create_task(
                http.post("/generate", json={"rid": "a", "input_ids": PROMPT, "sampling_params": {**LONG, "n": 2}})
            )
            other = asyncio.create_task(
                http.post("/generate", json={"rid": "ab", "input_ids": PROMPT, "sampling_params": SHORT})
            )
            await until(lambda: engine.stats().num_waiting == 3, "three sequences queued")
            assert (await http.post("/abort_request", json={})).status_code == 200
            assert engine.stats().num_waiting == 3
            assert (await http.post("/abort_request", json={"rid": "a"})).status_code == 200
            assert engine.stats().num_waiting == 1
            await asyncio.wrap_future(engine.call(engine.resume))
            aborted = (await mine).json()
            assert [s["meta_info"]["finish_reason"]["type"] for s in aborted] == ["abort", "abort"]
            assert (await other).json()["meta_info"]["finish_reason"]["type"] == "length"

    asyncio.run(scenario())


def test_a_cancelled_generation_aborts_its_sequences(make_server, engine) -> None:
    """What a client disconnect does to its handler: the sequences stop, others go on."""
    server = make_server()
    item = {"input_ids": PROMPT, "sampling_params": {**LONG, "n": 3}, "rid": "gone"}
    item.update(return_logprob=False, logprob_start_len=-1)

    async def scenario() -> None:
        disconnected = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await disconnected.wait()
            return {"type": "http.disconnect"}

        watched = asyncio.create_task(run_while_connected(receive, server.generate_sequences([item])))
        await until(lambda: engine.stats().num_running == 3, "the request running")
        disconnected.set()
        assert await watched == (False, None)
        await until(lambda: idle(engine), "the engine idle after the disconnect")

        async def connected() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        finished = await run_while_connected(connected, server.generate_sequences([{**item, "sampling_params": SHORT}]))
        assert finished[0] is True and finished[1][0].finish_reason["type"] == "length"

    asyncio.run(scenario())


def test_health_is_503_only_when_the_server_cannot_serve(make_server, engine, monkeypatch) -> None:
    server = make_server()

    async def scenario() -> None:
        async with client(server) as http:
            await asyncio.wrap_future(engine.call(lambda: engine.pause("abort")))
            assert (await http.get("/health")).status_code == 200  # a pause the trainer asked for
            await asyncio.wrap_future(engine.call(engine.resume))
            with monkeypatch.context() as patch:
                patch.setattr(engine, "stalled_s", lambda: 1e4)
                stalled = await http.get("/health")
                assert stalled.status_code == 503 and "one iteration for 10000 s" in message(stalled)
            with monkeypatch.context() as patch:
                patch.setattr(server.weights, "stuck_reason", lambda: "the drain passed its deadline")
                stuck = await http.get("/health_generate")
                assert stuck.status_code == 503 and message(stuck) == "the drain passed its deadline"
            assert (await http.get("/health")).status_code == 200
            server.closing = True
            assert (await http.get("/ready")).status_code == 503

    asyncio.run(scenario())


def test_limits_refuse_nonsense_values() -> None:
    from areal_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="max_n must be a positive integer"):
        ServerLimits(max_n=0)
    with pytest.raises(ConfigError, match="tokenize_timeout_s"):
        ServerLimits(tokenize_timeout_s=-1)
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        ServerLimits(chat_template_kwargs="enable_thinking")  # type: ignore[arg-type]
