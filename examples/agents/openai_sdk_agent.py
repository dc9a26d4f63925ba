"""A black-box calculator agent written against the official ``openai`` SDK, run as a subprocess.

It knows nothing of training: it reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the
environment (``openai.OpenAI()`` does), as any OpenAI agent does; pointing them at areal's proxy is
what makes its calls training data.

Contract (shared with ``openai_agents_sdk_agent.py``):

* stdin: one JSON object, the task item: ``{"prompt": "What is 47 + 82?"}``; other keys (an
  ``answer``, ids) are ignored. Optional: ``max_turns`` (default 4); ``system_prompt`` (the
  instructions; default the calculator's); ``tools`` (the calculator is offered only when the item
  has tools, as ``demo:calculator`` items do: on a plain task the loop is a one-turn chat). The
  ``agent_command`` workflow sends exactly such an item.
* the model name: ``$OPENAI_MODEL``, default ``areal`` (servers here ignore it).
* stdout: one JSON object, ``{"final": "<the last reply's text>", "messages": [...]}`` with the
  whole chat as sent (system, user, assistant tool calls, ``role: tool`` results with their
  ``tool_call_id``, the final assistant reply); ``final`` is "" when the agent ran out of turns.
  Exit status 0 whenever the model could be asked; a failing request exits non-zero.

Run: ``OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... python
examples/agents/openai_sdk_agent.py <<< '{"prompt": "What is 47 + 82?"}'``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import openai

from areal_tasks.agent.tools.calculator import CALCULATOR_TOOL, TOOL_NAME, call_calculator

#: the agent's instructions (the calculator task's system prompt, which its warm start was trained on).
INSTRUCTIONS = "Use the calculator tool, then reply with 'Answer: <integer>'."
MAX_TURNS = 4
MAX_TOKENS = 64


def run_tool(name: str, arguments: str) -> str:
    """The text of a tool's result; unknown tools and bad arguments come back as error texts."""
    if name != TOOL_NAME:
        return f"error: unknown tool {name!r}; the only tool is {TOOL_NAME!r}"
    return call_calculator(arguments)


def solve(
    client: openai.OpenAI, prompt: str, max_turns: int, instructions: str = INSTRUCTIONS, use_tools: bool = True
) -> tuple[str, list[dict[str, Any]]]:
    """``(final_text, messages)`` of the tool-calling loop."""
    model = os.environ.get("OPENAI_MODEL", "areal")
    tools = {"tools": [CALCULATOR_TOOL]} if use_tools else {}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": instructions},
        {"role": "user", "content": prompt},
    ]
    for _ in range(max_turns):
        completion = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, **tools)
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        if not message.tool_calls:
            return message.content or "", messages
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "", messages


def main() -> int:
    item = json.load(sys.stdin)
    with openai.OpenAI(max_retries=0) as client:
        final, messages = solve(
            client,
            str(item["prompt"]),
            int(item.get("max_turns", MAX_TURNS)),
            instructions=str(item.get("system_prompt") or INSTRUCTIONS),
            use_tools=bool(item.get("tools", True)),
        )
    json.dump({"final": final, "messages": messages}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
