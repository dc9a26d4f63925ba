"""Tool-call parsing (Hermes/Qwen2.5 blocks) and what tool_choice / parallel_tool_calls mean."""

from __future__ import annotations

import json

import pytest

from areal_tasks.agent.tool_calls import parse_tool_calls, resolve_tool_choice
from areal_tasks.errors import AgentRequestError

TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}},
]


def test_parses_several_calls_with_object_or_string_arguments() -> None:
    text = (
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": "é"}}\n</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 2}"}</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me add."
    assert [c["function"]["name"] for c in calls] == ["add", "mul"]
    assert calls[0]["function"]["arguments"] == '{"a": 1, "b": "é"}'
    assert json.loads(calls[1]["function"]["arguments"]) == {"a": 2}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_malformed_blocks_stay_in_the_content() -> None:
    assert parse_tool_calls("plain") == ("plain", [])
    bad = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(bad) == (bad, [])
    nameless = '<tool_call>{"arguments": {}}</tool_call>'
    assert parse_tool_calls(nameless) == (nameless, [])
    cut = '<tool_call>\n{"name": "add", "argu'
    assert parse_tool_calls(cut) == (cut, [])
    content, calls = parse_tool_calls(bad + '<tool_call>{"name": "g"}</tool_call>')
    assert content == bad and calls[0]["function"] == {"name": "g", "arguments": "{}"}


def test_tool_choice_policies() -> None:
    auto = resolve_tool_choice(TOOLS, None)
    assert auto.tools == TOOLS and auto.parse and auto.parallel
    assert resolve_tool_choice(TOOLS, "auto") == auto
    none = resolve_tool_choice(TOOLS, "none")
    assert none.tools is None and not none.parse
    assert none.split('<tool_call>{"name": "add"}</tool_call>') == ('<tool_call>{"name": "add"}</tool_call>', [])
    assert resolve_tool_choice(TOOLS, "required").parse
    named = resolve_tool_choice(TOOLS, {"type": "function", "function": {"name": "mul"}})
    assert named.tools == TOOLS and named.parse
    no_tools = resolve_tool_choice(None, None)
    assert no_tools.tools is None and not no_tools.parse


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (TOOLS, {"type": "function", "function": {"name": "div"}}, "tool_choice"),
        (TOOLS, "sometimes", "tool_choice"),
        (None, "required", "tool_choice"),
        ([{"type": "web_search"}], None, "tools"),
        ([{"type": "function", "function": {}}], None, "tools"),
    ],
)
def test_bad_tool_fields_are_refused_by_name(tools, choice, param) -> None:
    with pytest.raises(AgentRequestError) as err:
        resolve_tool_choice(tools, choice)
    assert err.value.param == param


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    text = (
        '<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>{"name": "mul", "arguments": {}}</tool_call>'
    )
    _, calls = resolve_tool_choice(TOOLS, "auto", parallel_tool_calls=False).split(text)
    assert [c["function"]["name"] for c in calls] == ["add"]
    _, calls = resolve_tool_choice(TOOLS, "auto", parallel_tool_calls=True).split(text)
    assert len(calls) == 2
