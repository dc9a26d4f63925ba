"""Incremental chat rendering: a request extending an earlier turn gets the earlier prompt and output
ids plus a bridge of new text only, equal to a fresh rendering when the output is canonical."""

from __future__ import annotations

import pytest

from areal_tasks.agent.chat_render import ChatRenderer, normalize_messages, same_message
from areal_tasks.errors import AgentRequestError
from tests.unit.agent.templates import tokenizer_named

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


def _turn(renderer: ChatRenderer, messages, tools, output_text: str, eos: bool = True):
    """(prompt text, prompt ids, output ids) of a fresh turn whose model wrote ``output_text``."""
    tok = renderer.tokenizer
    text = renderer.text(messages, tools)
    out = renderer.encode(output_text) + ([tok.eos_token_id] if eos else [])
    return text, renderer.encode(text), out


@pytest.mark.parametrize("template", ["chatml", "qwen25"])
def test_bridge_equals_fresh_rendering_for_canonical_output(template: str) -> None:
    renderer = ChatRenderer(tokenizer_named(template))
    eos = renderer.tokenizer.eos_token_id
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1+2?"}]
    returned = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    output = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    text, prompt, out = _turn(renderer, first, TOOLS, output)
    second = [*first, returned, {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    new_text = renderer.text(second, TOOLS)
    bridge = renderer.bridge(first, text, returned, eos, second, TOOLS, new_text)
    assert bridge is not None
    assert prompt + out + bridge == renderer.encode(new_text)
    # third turn: a plain answer, then a user turn
    answer = {"role": "assistant", "content": "It is 3."}
    third = [*second, answer, {"role": "user", "content": "Thanks"}]
    prompt2 = prompt + out + bridge
    out2 = [*renderer.encode("It is 3."), eos]
    bridge2 = renderer.bridge(second, new_text, answer, eos, third, TOOLS, renderer.text(third, TOOLS))
    assert prompt2 + out2 + bridge2 == renderer.encode(renderer.text(third, TOOLS))


def test_output_cut_without_eos_gets_the_whole_closing_in_the_bridge() -> None:
    renderer = ChatRenderer(tokenizer_named("chatml"))
    tok = renderer.tokenizer
    first = [{"role": "user", "content": "Count"}]
    returned = {"role": "assistant", "content": "1 2 3"}
    text, _, _ = _turn(renderer, first, None, "1 2 3", eos=False)
    second = [*first, returned, {"role": "user", "content": "More"}]
    bridge = renderer.bridge(first, text, returned, None, second, None, renderer.text(second, None))
    assert tok.decode(bridge) == "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"
    with_eos = renderer.bridge(first, text, returned, tok.eos_token_id, second, None, renderer.text(second, None))
    assert tok.decode(with_eos) == "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_history_gives_no_bridge() -> None:
    renderer = ChatRenderer(tokenizer_named("chatml"))
    first = [{"role": "user", "content": "Hi"}]
    returned = {"role": "assistant", "content": "Hello"}
    text, _, _ = _turn(renderer, first, None, "Hello")
    # tools appear only now: the system turn changes, so the new rendering does not extend the old
    second = [*first, returned, {"role": "user", "content": "Again"}]
    bridge = renderer.bridge(first, text, returned, 2, second, TOOLS, renderer.text(second, TOOLS))
    assert bridge is None


def test_messages_compare_semantically() -> None:
    a = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    b = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "tool_calls": [{**CALL, "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}],
    }
    assert same_message(a, normalize_messages([b])[0])
    c = {**b, "tool_calls": [{**CALL, "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]}
    assert not same_message(a, c)
    assert same_message({"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "user", "content": "x"})


def test_bad_messages_are_refused_naming_messages() -> None:
    renderer = ChatRenderer(tokenizer_named("chatml"))
    with pytest.raises(AgentRequestError) as err:
        normalize_messages([{"content": "no role"}])
    assert err.value.param == "messages"
    with pytest.raises(AgentRequestError) as err:
        renderer.text([{"role": "wizard", "content": "x"}], None)
    assert err.value.param == "messages"
