"""An in-process tool-using agent on the calculator task: ``async def run(client, data) -> float``.

``client`` is anything shaped like ``openai.AsyncOpenAI`` (the official SDK pointed at an
OpenAI-compatible server, or areal's ``ArealOpenAI``, which records every call for training).
``data`` is a task item: a ``Record`` of ``demo:calculator`` or a mapping with ``prompt`` and
``answer`` (``What is 47 + 82?``, ``129``).

The loop is the one every OpenAI tool-calling agent runs: send the chat with the calculator in
``tools``; when the reply has tool calls, append the assistant message (tool calls and all) and one
``role: tool`` message per call, carrying the call's ``tool_call_id`` and the tool's text; when it
has none, its text is the final answer. At most ``MAX_TURNS`` calls. The reward is the task's:
1.0 when the final ``Answer: N`` is right, else 0.0.

The calculator is offered when the item carries tools (``demo:calculator`` items do); on a plain
task (``demo:arithmetic``) the same loop is a one-turn chat. The system prompt is the job's
(``rollout.workflow.system_prompt``, which the ``agent`` workflow passes), else the calculator's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from areal_tasks.agent.tools.calculator import CALCULATOR_TOOL, TOOL_NAME, call_calculator
from areal_tasks.datasets.calculator import SYSTEM_PROMPT
from areal_tasks.datasets.reward import arithmetic_reward

logger = logging.getLogger(__name__)

MAX_TURNS = 4
MAX_TOKENS = 64
MODEL = "areal"


def _field(data: Any, name: str) -> Any:
    return data[name] if isinstance(data, Mapping) else getattr(data, name)


def assistant_message(message: Any) -> dict[str, Any]:
    """A reply's ``ChatCompletionMessage`` as the assistant message param the next request sends."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    return out


def tool_message(call: Any) -> dict[str, Any]:
    """The ``role: tool`` answer to one tool call (unknown tools get an error text, never an exception)."""
    if call.function.name == TOOL_NAME:
        content = call_calculator(call.function.arguments)
    else:
        content = f"error: unknown tool {call.function.name!r}; the only tool is {TOOL_NAME!r}"
    return {"role": "tool", "tool_call_id": call.id, "content": content}


async def solve(
    client: Any,
    prompt: str,
    *,
    max_turns: int = MAX_TURNS,
    system_prompt: str = SYSTEM_PROMPT,
    use_tools: bool = True,
) -> tuple[str, list[dict[str, Any]]]:
    """``(final_text, messages)``: the agent's last reply text ("" if it never stopped calling tools)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": prompt},
    ]
    tools = {"tools": [CALCULATOR_TOOL]} if use_tools else {}
    for _ in range(max_turns):
        completion = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=MAX_TOKENS, **tools
        )
        message = completion.choices[0].message
        messages.append(assistant_message(message))
        if not message.tool_calls:
            return message.content or "", messages
        messages.extend(tool_message(call) for call in message.tool_calls)
    logger.debug("no final answer after %d turns", max_turns)
    return "", messages


def _tools_of(data: Any) -> bool:
    tools = data.get("tools") if isinstance(data, Mapping) else getattr(data, "tools", None)
    return bool(tools)


async def run(client: Any, data: Any, system_prompt: str | None = None) -> float:
    """Solve one task item with ``client``; the reward: 1.0 for the right ``Answer: N``, else 0.0."""
    final, _ = await solve(
        client,
        str(_field(data, "prompt")),
        system_prompt=system_prompt or SYSTEM_PROMPT,
        use_tools=_tools_of(data),
    )
    return arithmetic_reward(final, _field(data, "answer"))
