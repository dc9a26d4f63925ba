"""The agent proxy over vLLM's CPU build: the session's shared vLLM server behind a ``ProxyServer``,
driven by the official ``openai`` SDK (chat plain and streamed, a text completion), and the session's
group exported with vLLM's tokens and log-probs."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import vllm_test_server

from areal_tasks.agent.proxy.server import ProxyServer
from areal_tasks.api.inference import SamplingParams
from tests.unit.agent.proxy.proxy_thread import ProxyThread

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer vllm-proxy-admin"}


def test_the_proxy_serves_sessions_over_vllm(vllm_server: vllm_test_server.VLLMServer) -> None:
    from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
    from areal_tasks.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(vllm_server.model_path))

    def build() -> ProxyServer:
        engine = RemoteInferenceEngine(
            [vllm_server.address],
            make_adapter("vllm", model=vllm_test_server.SERVED_NAME),
            ClientConfig(request_timeout_s=120.0, max_retries=1, api_key=vllm_server.api_key or None),
        )
        return ProxyServer(
            engine, tokenizer, admin_api_key="vllm-proxy-admin", sampling=SamplingParams(max_new_tokens=8)
        )

    with ProxyThread(build) as proxy:
        session = httpx.post(f"{proxy.url}/rl/start_session", headers=ADMIN, timeout=30).json()

        async def agent() -> tuple[str, str]:
            client = openai.AsyncOpenAI(
                base_url=proxy.url + "/v1", api_key=session["api_key"], max_retries=0, timeout=120
            )
            messages = [{"role": "user", "content": "Which is larger, 3 or 5?"}]
            first = await client.chat.completions.create(model="areal", messages=messages, max_tokens=6)
            messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Why?"}]
            stream = await client.chat.completions.create(
                model="areal", messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
            text = await client.completions.create(model="areal", prompt="1 2 3", max_tokens=4)
            await client.close()
            return first.choices[0].message.content or "", text.choices[0].text

        asyncio.run(agent())
        key = {"Authorization": f"Bearer {session['api_key']}"}
        assert (
            httpx.post(f"{proxy.url}/rl/set_reward", json={"reward": 0.25}, headers=key, timeout=30).status_code == 200
        )
        ended = httpx.post(f"{proxy.url}/rl/end_session", headers=key, timeout=60).json()
        assert ended["interactions"] == 3
        group = httpx.get(f"{proxy.url}/rl/groups/next", params={"timeout": 30}, headers=ADMIN, timeout=60).json()
        assert group["session_id"] == session["session_id"]
        chat, text = group["trajectories"]  # the two chat turns as one conversation, the text completion
        assert chat["metadata"]["turns"] == 2 and text["reward"] == 0.25
        for sample in group["trajectories"]:
            trained = [lp for lp, m in zip(sample["logprobs"], sample["loss_mask"]) if m]
            assert trained and all(lp <= 0.0 for lp in trained)  # vLLM's log-probs of the sampled tokens
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=proxy.url + "/v1", api_key=session["api_key"], max_retries=0).models.list()
