"""The proxy over HTTP, driven by the official ``openai`` SDK and httpx (a scripted engine behind it):
completions and streams recorded per session, rewards, ends and exported groups, keys and isolation,
limits, and failures that leave the session and the server serving."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.unit.agent.proxy.conftest import ADMIN, PromptEngine, start_session
from tests.unit.agent.proxy.proxy_thread import ProxyThread

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a+b", "parameters": {"type": "object"}}}]
HI = [{"role": "user", "content": "hi"}]


def sdk(proxy: ProxyThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=30)


def next_group(proxy: ProxyThread, **params: object) -> httpx.Response:
    return httpx.get(f"{proxy.url}/rl/groups/next", params={"timeout": 5, **params}, headers=ADMIN, timeout=30)


def group_of(proxy: ProxyThread, session_id: str, **params: object) -> dict:
    """The exported group of ``session_id`` (other tests' groups popped on the way are dropped)."""
    for _ in range(20):
        answer = next_group(proxy, **params)
        assert answer.status_code == 200, answer.text
        if answer.json()["session_id"] == session_id:
            return answer.json()
    raise AssertionError(f"no group of {session_id}")


def test_a_session_chats_streams_rewards_ends_and_its_group_is_exported(proxy: ProxyThread) -> None:
    session_id, key = start_session(proxy.url)
    client = sdk(proxy, key)
    first = client.chat.completions.create(model="areal", messages=HI)
    assert first.choices[0].message.content == "hello there" and first.id.startswith("chatcmpl-")
    messages = [*HI, first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    chunks = list(
        client.chat.completions.create(
            model="areal", messages=messages, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello there"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert client.models.list().data[0].id == "areal"
    text = client.completions.create(model="areal", prompt="say hi")
    assert text.choices[0].text == "hello there"

    answer = httpx.post(
        f"{proxy.url}/rl/set_reward",
        json={"reward": 0.5, "completion_id": first.id},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 200, answer.text
    answer = httpx.post(f"{proxy.url}/rl/set_reward", json={"reward": 1.0}, headers={"Authorization": f"Bearer {key}"})
    assert answer.json()["completion_id"] == text.id  # the last completion by default
    status = httpx.get(f"{proxy.url}/rl/sessions/{session_id}", headers=ADMIN).json()
    assert status["state"] == "open" and status["interactions"] == 3
    ended = httpx.post(f"{proxy.url}/rl/end_session", headers={"Authorization": f"Bearer {key}"}).json()
    assert ended == {"session_id": session_id, "reason": "ended", "interactions": 3, "reward": 1.0}

    group = group_of(proxy, session_id)
    assert group["style"] == "concat"
    # the chat turns are one conversation (one sample), the text completion another
    assert len(group["trajectories"]) == 2 and group["trajectories"][0]["metadata"]["turns"] == 2
    assert group["rewards"] == [0.0, 1.0]
    with pytest.raises(openai.AuthenticationError, match="has ended"):
        client.chat.completions.create(model="areal", messages=HI)
    assert httpx.get(f"{proxy.url}/rl/sessions/{session_id}", headers=ADMIN).json()["state"] == "ended"


def test_individual_export_and_end_reward_with_discount(proxy: ProxyThread) -> None:
    session_id, key = start_session(proxy.url)
    client = sdk(proxy, key)
    first = client.chat.completions.create(model="areal", messages=HI)
    messages = [*HI, first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    client.chat.completions.create(model="areal", messages=messages)
    httpx.post(
        f"{proxy.url}/rl/end_session", json={"session_id": session_id, "reward": 1.0, "discount": 0.5}, headers=ADMIN
    )
    group = group_of(proxy, session_id, style="individual")
    assert group["rewards"] == [0.5, 1.0]
    assert all(t["loss_mask"][t["prompt_len"] :] for t in group["trajectories"])


def test_tool_calls_in_every_tool_choice_form_and_streamed(proxy: ProxyThread) -> None:
    _, key = start_session(proxy.url)
    client = sdk(proxy, key)
    ask = [{"role": "user", "content": "TOOL add 1 and 2"}]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "add"}}):
        answer = client.chat.completions.create(model="areal", messages=ask, tools=TOOLS, tool_choice=choice)
        call = answer.choices[0].message.tool_calls[0]
        assert answer.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    stream = client.chat.completions.create(model="areal", messages=ask, tools=TOOLS, stream=True)
    deltas = [d for chunk in stream for c in chunk.choices for d in (c.delta.tool_calls or [])]
    assert deltas[0].function.name == "add"
    none = client.chat.completions.create(model="areal", messages=ask, tools=TOOLS, tool_choice="none")
    assert not none.choices[0].message.tool_calls


def test_keys_isolate_sessions_and_admin_routes_need_the_admin_key(proxy: ProxyThread) -> None:
    _, key_a = start_session(proxy.url)
    session_b, key_b = start_session(proxy.url)
    completion = sdk(proxy, key_a).chat.completions.create(model="areal", messages=HI)
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        sdk(proxy, "sk-areal-wrong").chat.completions.create(model="areal", messages=HI)
    with pytest.raises(openai.AuthenticationError):
        sdk(proxy, ADMIN["Authorization"][7:]).chat.completions.create(model="areal", messages=HI)
    # session b can neither reward nor read a's completion: 404 naming the id, as for one that never was
    for completion_id in (completion.id, "chatcmpl-never"):
        answer = httpx.post(
            f"{proxy.url}/rl/set_reward",
            json={"reward": 1.0, "completion_id": completion_id},
            headers={"Authorization": f"Bearer {key_b}"},
        )
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == f"no completion {completion_id!r} in this session"
        assert answer.json()["error"]["param"] == "completion_id"
        read = httpx.get(
            f"{proxy.url}/v1/chat/completions/{completion_id}", headers={"Authorization": f"Bearer {key_b}"}
        )
        assert read.status_code == 404 and read.json()["error"]["type"] == "not_found_error"
    mine = httpx.get(f"{proxy.url}/v1/chat/completions/{completion.id}", headers={"Authorization": f"Bearer {key_a}"})
    assert mine.json()["id"] == completion.id
    for method, path in (
        ("POST", "/rl/start_session"),
        ("GET", f"/rl/sessions/{session_b}"),
        ("GET", "/rl/groups/next"),
    ):
        for headers in ({}, {"Authorization": f"Bearer {key_b}"}, {"Authorization": "Bearer nope"}):
            answer = httpx.request(method, proxy.url + path, headers=headers)
            assert answer.status_code == 401, (path, answer.text)
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    # the admin key with a session_id ends b; a's key cannot end b
    answer = httpx.post(
        f"{proxy.url}/rl/end_session", json={"session_id": session_b}, headers={"Authorization": f"Bearer {key_a}"}
    )
    assert answer.status_code == 200 and answer.json()["session_id"] != session_b  # it ended a's own session
    assert httpx.post(f"{proxy.url}/rl/end_session", json={"session_id": session_b}, headers=ADMIN).status_code == 200
    assert httpx.post(f"{proxy.url}/rl/end_session", json={"session_id": session_b}, headers=ADMIN).status_code == 409
    assert group_of(proxy, session_b)["interactions"] == 0


def test_limits_refuse_with_429_and_413(proxy: ProxyThread, engine: PromptEngine) -> None:
    session_id, key = start_session(proxy.url)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=30)
    held = [{"role": "user", "content": "HOLD"}]

    async def scenario() -> None:
        import asyncio

        tasks = [asyncio.ensure_future(client.chat.completions.create(model="areal", messages=held)) for _ in range(2)]
        deadline = time.monotonic() + 10
        while engine.held < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with pytest.raises(openai.RateLimitError, match="in flight"):
            await client.chat.completions.create(model="areal", messages=HI)
        engine.release.set()
        await asyncio.gather(*tasks)
        for _ in range(4):  # 2 + 4 = max_interactions
            await client.chat.completions.create(model="areal", messages=HI)
        with pytest.raises(openai.RateLimitError, match="completions, its limit"):
            await client.chat.completions.create(model="areal", messages=HI)
        await client.close()

    engine.held = 0
    import asyncio

    asyncio.run(scenario())
    big = {"model": "areal", "messages": [{"role": "user", "content": "x" * 70_000}]}
    answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=big, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 413 and "limit of 65536 bytes" in answer.json()["error"]["message"]
    httpx.post(f"{proxy.url}/rl/end_session", json={"session_id": session_id}, headers=ADMIN)
    assert group_of(proxy, session_id)["interactions"] == 6


def test_a_streamed_body_over_the_limit_is_refused_as_it_arrives_with_an_openai_error(proxy: ProxyThread) -> None:
    session_id, key = start_session(proxy.url)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def chunks():  # no Content-Length: the body is counted as it streams in
        yield b'{"model": "areal", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"x" * 4096
        yield b'"}]}'

    streamed = httpx.post(f"{proxy.url}/v1/chat/completions", content=chunks(), headers=headers)
    assert streamed.status_code == 413, streamed.text
    error = streamed.json()["error"]
    assert "this proxy's limit of 65536 bytes" in error["message"] and error["type"] == "invalid_request_error"
    httpx.post(f"{proxy.url}/rl/end_session", json={"session_id": session_id}, headers=ADMIN)
    assert group_of(proxy, session_id)["interactions"] == 0


def test_failures_are_openai_errors_and_leave_the_session_usable(proxy: ProxyThread) -> None:
    _, key = start_session(proxy.url)
    client = sdk(proxy, key)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="areal", messages=[{"role": "user", "content": "FAIL"}])
    assert failed.value.status_code == 502 and "scripted server failed" in failed.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="areal", messages=HI, logit_bias={"1": 5})
    assert bad.value.body["param"] == "logit_bias"
    raw = httpx.post(f"{proxy.url}/v1/chat/completions", content=b"{nope", headers={"Authorization": f"Bearer {key}"})
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(
        f"{proxy.url}/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert missing.status_code == 400
    assert client.chat.completions.create(model="areal", messages=HI).choices[0].message.content == "hello there"


def test_a_client_leaving_mid_generation_stops_only_its_request(proxy: ProxyThread, engine: PromptEngine) -> None:
    _, key = start_session(proxy.url)
    headers = {"Authorization": f"Bearer {key}"}
    engine.held = engine.cancelled = 0
    for stream in (False, True):
        body = {"model": "areal", "messages": [{"role": "user", "content": "HOLD"}], "stream": stream}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=0.5)
    deadline = time.monotonic() + 10
    while engine.cancelled < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.cancelled == 2  # both generations stopped with their clients
    # the session's slots are free again and the proxy serves
    assert sdk(proxy, key).chat.completions.create(model="areal", messages=HI).choices[0].message.content
    assert httpx.get(f"{proxy.url}/health").json()["status"] == "ok"
