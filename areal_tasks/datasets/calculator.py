"""The ``calculator`` demo task: "What is 47 + 82?" solved by calling a calculator tool.

The problems are the arithmetic task's (:mod:`areal_tasks.datasets.arithmetic`: ``digits``, ``ops``
over ``+`` and ``-``, disjoint seeded splits); each record also carries the calculator's OpenAI tool
schema, so an agent (``examples/agents/``) offers the tool and the SFT warm start renders it.

A demonstration (``datasets/sft.py``) is a tool-using chat transcript: the assistant calls
``calculator`` with the question's expression (:func:`tool_call_turns`), the tool answers with the
value (computed by the real tool), and the assistant ends with ``Answer: N``. The three digits of
a two-digit sum are hard for a tiny model to compute but easy to copy, so the tool is genuinely
useful.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from areal_tasks.agent.tools.calculator import CALCULATOR_TOOL, TOOL_NAME, calculate
from areal_tasks.datasets.answers import ANSWER_FORMAT
from areal_tasks.datasets.arithmetic import ArithmeticOptions
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

#: the task's system prompt (agents that want the warm start's behaviour send exactly this).
SYSTEM_PROMPT = f"Use the calculator tool, then reply with '{ANSWER_FORMAT}'."
TOOLS: tuple[dict, ...] = (CALCULATOR_TOOL,)

_QUESTION = re.compile(r"^What is (.+)\?$")


@dataclass(frozen=True)
class CalculatorOptions(ArithmeticOptions):
    """The arithmetic task's options, two-digit sums and differences by default (no ``>``)."""

    digits: int = 2
    ops: str = "+-"

    def __post_init__(self) -> None:
        super().__post_init__()
        if ">" in self.ops:
            raise ConfigError(f"calculator ops={self.ops!r}: only + and - (the calculator has no 'larger of')")


def expression_of(prompt: str) -> str:
    """``"What is 47 + 82?"`` -> ``"47 + 82"``; ConfigError for other prompts."""
    match = _QUESTION.match(prompt.strip())
    if match is None:
        raise ConfigError(f"calculator prompt {prompt!r} is not of the form 'What is <expression>?'")
    return match.group(1)


def tool_call_turns(expression: str, call_id: str = "call_0") -> tuple[dict, dict]:
    """The assistant message calling the calculator on ``expression`` and the tool's answer."""
    arguments = json.dumps({"expression": expression})
    call = {"id": call_id, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
    return (
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": calculate(expression)},
    )
