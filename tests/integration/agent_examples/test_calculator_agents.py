"""The three calculator agents (examples/agents/) against a real OpenAI-speaking server: ``areal
serve`` on the calculator warm start, behind a recording forwarder (greedy sampling).

Each agent solves a few eval items and must (1) finish and report its transcript, (2) put on the
wire exactly the chat its SDK is meant to send: every tool call of an answer comes back in the next
request as the assistant message with the same calls, followed by one ``role: tool`` message per
call carrying its ``tool_call_id`` and the calculator's result, with the earlier messages
unchanged, and (3) report as its transcript what it last sent plus the final reply. The in-process
agent runs on ``openai.AsyncOpenAI``; the black-box ones run as subprocesses with only
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set (the openai-agents one in ``.venv-agents``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recorder import Recorder

from areal_tasks.agent.tools.calculator import call_calculator
from areal_tasks.datasets import arithmetic_reward, load_records
from tests.fixtures.agents_env import agents_python

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

SPEC = "demo:calculator?digits=2&n_train=3000&n_eval=100&wrong_fraction=0.3"
N_ITEMS = 3
ITEMS = load_records(SPEC, "eval")[:N_ITEMS]


def check_tool_flow(requests: list[dict[str, Any]], responses: list[dict[str, Any]]) -> int:
    """Assert the tool-call message flow of one conversation (see the module docstring); the number of calls."""
    n_calls = 0
    for i, answer in enumerate(responses[:-1]):
        sent, following = requests[i]["messages"], requests[i + 1]["messages"]
        calls = answer["choices"][0]["message"].get("tool_calls") or []
        assert calls, f"request {i + 1} follows an answer without tool calls"
        n_calls += len(calls)
        assert following[: len(sent)] == sent
        assistant, results = following[len(sent)], following[len(sent) + 1 :]
        assert assistant["role"] == "assistant"
        assert [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]
        ] == [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        assert results == [
            {"role": "tool", "tool_call_id": c["id"], "content": call_calculator(c["function"]["arguments"])}
            for c in calls
        ]
        assert all(r["content"] and not r["content"].startswith("error") for r in results)
        assert requests[i + 1]["tools"] == requests[0]["tools"]
    return n_calls


def check_transcript(messages: list[dict[str, Any]], final: str, rec: Recorder) -> None:
    """The reported transcript: the last request's messages, then the final reply."""
    last_request = rec.requests[-1]["messages"]
    assert [m["role"] for m in messages[: len(last_request)]] == [m["role"] for m in last_request]
    assert messages[: len(last_request)] == last_request
    reply = rec.responses[-1]["choices"][0]["message"]
    assert final == (reply["content"] or "" if not reply.get("tool_calls") else "")


def test_in_process_agent(recorder: Recorder, api_key: str) -> None:
    import openai
    from calculator_agent import run, solve

    async def main() -> int:
        client = openai.AsyncOpenAI(base_url=recorder.url, api_key=api_key)
        calls = 0
        for item in ITEMS:
            recorder.requests.clear()
            recorder.responses.clear()
            final, messages = await solve(client, item.prompt)
            calls += check_tool_flow(recorder.requests, recorder.responses)
            check_transcript(messages[:-1], final, recorder)
            assert messages[-1]["role"] == "assistant"
            assert recorder.requests[0]["tools"][0]["function"]["name"] == "calculator"
            assert await run(client, item) == arithmetic_reward(final, item.answer)  # greedy: the same answer
        await client.close()
        return calls

    assert asyncio.run(main()) >= 1, "the warm start never called the calculator"


def _run_script(python: Path | str, script: str, item: Any, rec: Recorder, api_key: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(OPENAI_BASE_URL=rec.url, OPENAI_API_KEY=api_key, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [str(python), str(ROOT / "examples" / "agents" / script)],
        input=json.dumps({"prompt": item.prompt, "answer": item.answer}),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("script", "venv"), [("openai_sdk_agent.py", "main"), ("openai_agents_sdk_agent.py", "agents")]
)
def test_black_box_agent_subprocess(script: str, venv: str, recorder: Recorder, api_key: str) -> None:
    python = sys.executable if venv == "main" else agents_python()
    calls = 0
    for item in ITEMS:
        recorder.requests.clear()
        recorder.responses.clear()
        out = _run_script(python, script, item, recorder, api_key)
        calls += check_tool_flow(recorder.requests, recorder.responses)
        check_transcript(out["messages"][:-1], out["final"], recorder)
        assert recorder.requests[0]["messages"][0] == {
            "role": "system",
            "content": recorder.requests[0]["messages"][0]["content"],
        }
        assert arithmetic_reward(out["final"], item.answer) in (0.0, 1.0)
    assert calls >= 1, "the warm start never called the calculator"
