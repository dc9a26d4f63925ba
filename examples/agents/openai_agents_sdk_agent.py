"""A black-box calculator agent written against the ``openai-agents`` SDK, run as a subprocess.

The same agent as ``openai_sdk_agent.py`` (same stdin/stdout contract, read its docstring), built
the way that SDK is meant to be used: an ``Agent`` with instructions and a function tool, driven
by ``Runner.run``, on an ``OpenAIChatCompletionsModel`` whose ``AsyncOpenAI`` client takes
its base URL and key from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``. Tracing is disabled: nothing
leaves the machine but the model calls. ``openai-agents`` pins conflict with areal's lock, so this
runs in its own venv (``make agents-env`` builds ``.venv-agents``):

The item's ``system_prompt`` and ``tools`` keys are honoured as in ``openai_sdk_agent.py``.
``OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... .venv-agents/bin/python
examples/agents/openai_agents_sdk_agent.py <<< '{"prompt": "What is 47 + 82?"}'``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from agents import Agent, FunctionTool, ModelSettings, RunContextWrapper, Runner, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from agents.models.chatcmpl_converter import Converter
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from areal_tasks.agent.tools.calculator import CALCULATOR_TOOL, TOOL_NAME, call_calculator

#: the agent's instructions (the calculator task's system prompt, which its warm start was trained on).
INSTRUCTIONS = "Use the calculator tool, then reply with 'Answer: <integer>'."
MAX_TURNS = 4
MAX_TOKENS = 64


async def _invoke_calculator(context: RunContextWrapper[Any], arguments: str) -> str:
    return call_calculator(arguments)


#: the calculator as a ``FunctionTool`` with the tool's own JSON schema: ``@function_tool`` would
#: derive one from a Python signature (with pydantic's titles), and a small model answers best to
#: the exact schema it was warm-started on.
calculator = FunctionTool(
    name=TOOL_NAME,
    description=CALCULATOR_TOOL["function"]["description"],
    params_json_schema=CALCULATOR_TOOL["function"]["parameters"],
    on_invoke_tool=_invoke_calculator,
    strict_json_schema=False,
)


def build_agent(instructions: str = INSTRUCTIONS, use_tools: bool = True) -> Agent:
    """The agent on a chat-completions model served at ``$OPENAI_BASE_URL``."""
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    model = OpenAIChatCompletionsModel(model=os.environ.get("OPENAI_MODEL", "areal"), openai_client=client)
    return Agent(
        name="calculator agent",
        instructions=instructions,
        tools=[calculator] if use_tools else [],
        model=model,
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
    )


async def solve(
    prompt: str, max_turns: int, instructions: str = INSTRUCTIONS, use_tools: bool = True
) -> tuple[str, list[dict[str, Any]]]:
    """``(final_text, messages)``: the run's items as chat messages (what the SDK sent, plus the reply)."""
    try:
        result = await Runner.run(build_agent(instructions, use_tools), prompt, max_turns=max_turns)
    except MaxTurnsExceeded as exc:
        items = exc.run_data.new_items if exc.run_data else []
        inputs = [{"role": "user", "content": prompt}, *(item.to_input_item() for item in items)]
        return "", [{"role": "system", "content": instructions}, *Converter.items_to_messages(inputs)]
    messages = Converter.items_to_messages(result.to_input_list())
    return str(result.final_output or ""), [{"role": "system", "content": instructions}, *messages]


def main() -> int:
    set_tracing_disabled(True)
    item = json.load(sys.stdin)
    final, messages = asyncio.run(
        solve(
            str(item["prompt"]),
            int(item.get("max_turns", MAX_TURNS)),
            instructions=str(item.get("system_prompt") or INSTRUCTIONS),
            use_tools=bool(item.get("tools", True)),
        )
    )
    json.dump({"final": final, "messages": messages}, sys.stdout, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
