"""The agent proxy in front of a real engine (``areal serve`` on the tiny qwen2, the module's shared
``agent_server``), driven by the official ``openai`` SDK exactly as an agent would drive OpenAI:
chat completions plain and streamed (with usage), tools in every ``tool_choice`` form and tool
results fed back, a session's group exported with the tokens the agent was answered with, and a
client leaving mid-generation while another session goes on."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from areal_tasks.agent.proxy.limits import ProxyLimits
from areal_tasks.agent.proxy.server import ProxyServer
from areal_tasks.api.inference import SamplingParams
from tests.unit.agent.proxy.proxy_thread import ProxyThread

pytestmark = pytest.mark.integration

PROXY_ADMIN = "proxy-admin-key"
ADMIN = {"Authorization": f"Bearer {PROXY_ADMIN}"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def proxy(agent_server: str, admin_key: str, tiny_qwen2: Path) -> Iterator[ProxyThread]:
    from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
    from areal_tasks.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_qwen2))

    def build() -> ProxyServer:
        engine = RemoteInferenceEngine(
            [agent_server.removeprefix("http://")],
            make_adapter("embedded"),
            ClientConfig(request_timeout_s=120.0, max_retries=1, admin_api_key=admin_key),
        )
        sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
        return ProxyServer(engine, tokenizer, admin_api_key=PROXY_ADMIN, sampling=sampling, limits=ProxyLimits())

    with ProxyThread(build) as running:
        yield running


def start(proxy: ProxyThread) -> tuple[str, openai.AsyncOpenAI]:
    body = httpx.post(f"{proxy.url}/rl/start_session", headers=ADMIN, timeout=30).json()
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=body["api_key"], max_retries=0, timeout=120)
    return body["session_id"], client


def end_and_export(proxy: ProxyThread, session_id: str, style: str = "concat") -> dict:
    httpx.post(f"{proxy.url}/rl/end_session", json={"session_id": session_id}, headers=ADMIN, timeout=60)
    for _ in range(10):
        group = httpx.get(
            f"{proxy.url}/rl/groups/next", params={"timeout": 30, "style": style}, headers=ADMIN, timeout=60
        ).json()
        if group["session_id"] == session_id:
            return group
    raise AssertionError(f"no group of {session_id}")


def test_chat_plain_and_streamed_with_the_sdk_become_one_exported_conversation(
    proxy: ProxyThread, tiny_qwen2: Path
) -> None:
    from areal_tasks.models.tokenizer import load_tokenizer

    session_id, client = start(proxy)

    async def agent() -> tuple[str, str]:
        messages = [{"role": "user", "content": "What is 2+3?"}]
        first = await client.chat.completions.create(model="areal", messages=messages, max_tokens=8, seed=1)
        assert first.object == "chat.completion" and first.usage.completion_tokens >= 1
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
        stream = await client.chat.completions.create(
            model="areal", messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage is not None and not chunks[-1].choices
        assert chunks[-2].choices[0].finish_reason in ("stop", "length")
        await client.close()
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return first.choices[0].message.content or "", streamed

    first_text, streamed_text = asyncio.run(agent())
    group = end_and_export(proxy, session_id)
    assert group["interactions"] == 2 and len(group["trajectories"]) == 1
    sample = group["trajectories"][0]
    assert sample["metadata"]["turns"] == 2
    tokenizer = load_tokenizer(str(tiny_qwen2))
    trained = [t for t, m in zip(sample["input_ids"], sample["loss_mask"]) if m]
    text = tokenizer.decode(trained, skip_special_tokens=True)
    assert first_text in text and streamed_text in text  # the recorded tokens are what the agent got
    assert all(v == 0 for v, m in zip(sample["versions"], sample["loss_mask"]) if m)


def test_tools_in_every_tool_choice_form_and_tool_results_fed_back(proxy: ProxyThread) -> None:
    session_id, client = start(proxy)
    ask = [{"role": "user", "content": "Use the calculator for 12*7."}]

    async def agent() -> None:
        for choice in ("auto", "required", "none", {"type": "function", "function": {"name": "calculator"}}):
            answer = await client.chat.completions.create(
                model="areal", messages=ask, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=8
            )
            message = answer.choices[0].message
            assert message.role == "assistant" and answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
        # a conversation that called the tool: the call and its result go back as the SDK sends them
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "12*7"}'},
        }
        history = [
            *ask,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "84"},
        ]
        stream = await client.chat.completions.create(
            model="areal", messages=history, tools=TOOLS, stream=True, max_tokens=8
        )
        assert [chunk async for chunk in stream][-1].choices[0].finish_reason is not None
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="areal", messages=ask, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}
            )
        assert bad.value.body["param"] == "tool_choice"
        await client.close()

    asyncio.run(agent())
    group = end_and_export(proxy, session_id, style="individual")
    assert group["interactions"] == 5 and len(group["trajectories"]) == 5
    status = httpx.get(f"{proxy.url}/rl/sessions/{session_id}", headers=ADMIN).json()
    assert status["state"] == "ended"
    assert json.dumps(group)  # the export is plain JSON


def test_a_client_leaving_mid_stream_leaves_the_proxy_serving(proxy: ProxyThread) -> None:
    session_id, client = start(proxy)
    key = client.api_key
    # greedy on this prompt, the tiny model runs to its token budget (about a second on CPU)
    body = {"model": "areal", "prompt": "1 2 3 4 5", "max_tokens": 1900, "temperature": 0, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{proxy.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=0.1)
    deadline = time.monotonic() + 30
    while httpx.get(f"{proxy.url}/rl/sessions/{session_id}", headers=ADMIN).json()["in_flight"]:
        assert time.monotonic() < deadline, "the left request still holds its session's slot"
        time.sleep(0.05)
    other_id, other = start(proxy)

    async def again() -> str:
        answer = await other.chat.completions.create(
            model="areal", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        await other.close()
        return answer.choices[0].message.content or ""

    assert isinstance(asyncio.run(again()), str)
    assert httpx.get(f"{proxy.url}/health").status_code == 200
    assert end_and_export(proxy, other_id)["interactions"] == 1
    end_and_export(proxy, session_id)
