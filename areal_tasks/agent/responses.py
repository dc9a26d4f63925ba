"""``ArealOpenAI.responses.create``: the Responses API mapped onto one chat turn.

``input`` (a string, or a list of message items, ``function_call`` and ``function_call_output``
items) and ``instructions`` become chat messages: instructions a system message, ``developer`` a
system message, a message of the assistant followed by ``function_call`` items one assistant message
with ``tool_calls``, each ``function_call_output`` a ``tool`` message. ``previous_response_id`` (an
earlier response of this client) puts that conversation and its output first. Function ``tools``
(flat in this API) and ``tool_choice`` are translated to the chat shapes; ``max_output_tokens``,
``temperature``, ``top_p`` and ``parallel_tool_calls`` carry over. The chat turn is recorded under
the response's id, so ``cache.set_reward(response.id, r)`` works. What does not map (other tool or
item types, structured ``text.format``, ``reasoning``, ``stream``) raises
:class:`~areal_tasks.errors.AgentRequestError` naming the field.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from areal_tasks.agent.requests import check_unsupported, present_fields
from areal_tasks.errors import AgentRequestError

if TYPE_CHECKING:
    from areal_tasks.agent.client import ArealOpenAI

logger = logging.getLogger(__name__)

__all__ = ["Responses", "input_messages"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for raw in content:
            part = raw.model_dump() if hasattr(raw, "model_dump") else raw
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                raise AgentRequestError("only text content parts are served", param="input")
            parts.append(part.get("text", ""))
        return "".join(parts)
    raise AgentRequestError(f"message content must be text, got {type(content).__name__}", param="input")


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Chat messages of a Responses ``input`` (see the module doc)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise AgentRequestError("input must be a string or a list of items", param="input")
    messages: list[dict[str, Any]] = []
    for raw in items:
        item = raw.model_dump(exclude_none=True) if hasattr(raw, "model_dump") else dict(raw)
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in ("user", "system", "developer", "assistant"):
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _text(item.get("content", ""))})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments", "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(output)})
        else:
            raise AgentRequestError(f"input items of type {kind!r} are not served", param="input")
    return messages


def _chat_tools(tools: list[Any]) -> list[dict[str, Any]]:
    out = []
    for raw in tools:
        tool = raw.model_dump(exclude_none=True) if hasattr(raw, "model_dump") else dict(raw)
        if tool.get("type") != "function" or not tool.get("name"):
            raise AgentRequestError(f"only function tools are served, got {tool.get('type')!r}", param="tools")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in (None, "auto", "none", "required"):
        return choice
    raise AgentRequestError(f"tool_choice={choice!r} is not served", param="tool_choice")


class Responses:
    """``client.responses``: ``create`` and the conversations of earlier responses."""

    def __init__(self, client: ArealOpenAI) -> None:
        self._client = client
        #: response id -> its messages plus the assistant message returned (for previous_response_id).
        self._conversations: dict[str, list[dict[str, Any]]] = {}

    async def create(self, *, input: Any, **kwargs: Any) -> Response:
        """``openai.AsyncOpenAI().responses.create`` over one chat turn (see the module doc)."""
        fields = present_fields(kwargs)
        check_unsupported(fields)
        for name in ("stream", "reasoning", "max_tool_calls", "prompt"):
            if fields.get(name):
                raise AgentRequestError(f"{name} is not served by the in-process Responses API", param=name)
        fmt = (fields.get("text") or {}).get("format")
        if fmt is not None and fmt.get("type") != "text":
            raise AgentRequestError("only text output is served (no structured formats)", param="text")
        messages = input_messages(input)
        previous = fields.get("previous_response_id")
        if previous is not None:
            if previous not in self._conversations:
                raise AgentRequestError(f"no response {previous!r} from this client", param="previous_response_id")
            messages = [*self._conversations[previous], *messages]
        if "instructions" in fields:
            messages = [{"role": "system", "content": fields["instructions"]}, *messages]
        chat = {k: fields[k] for k in ("temperature", "top_p", "parallel_tool_calls", "seed") if k in fields}
        if "max_output_tokens" in fields:
            chat["max_tokens"] = fields["max_output_tokens"]
        if fields.get("tools"):
            chat["tools"] = _chat_tools(fields["tools"])
        if "tool_choice" in fields:
            chat["tool_choice"] = _chat_tool_choice(fields["tool_choice"])
        rid = f"resp_{uuid.uuid4().hex}"
        completion, decoded, (item,) = await self._client.chat_turn(messages, chat, cid=rid)
        self._conversations[rid] = [*item.messages, item.message]
        choice = completion.choices[0]
        output: list[Any] = []
        if choice.message.content:
            text = ResponseOutputText(type="output_text", text=choice.message.content, annotations=[])
            output.append(
                ResponseOutputMessage(
                    id=f"msg_{uuid.uuid4().hex}", type="message", role="assistant", status="completed", content=[text]
                )
            )
        for call in choice.message.tool_calls or []:
            output.append(
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{uuid.uuid4().hex}",
                    call_id=call.id,
                    name=call.function.name,  # type: ignore[union-attr]
                    arguments=call.function.arguments,  # type: ignore[union-attr]
                    status="completed",
                )
            )
        cut = decoded[0].finish_reason == "length"
        usage = completion.usage
        response = Response.model_validate(
            {
                "id": rid,
                "object": "response",
                "created_at": float(int(time.time())),
                "model": self._client.model_name,
                "status": "incomplete" if cut else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "instructions": fields.get("instructions"),
                "output": [o.model_dump() for o in output],
                "parallel_tool_calls": fields.get("parallel_tool_calls", True),
                "tool_choice": fields.get("tool_choice", "auto"),
                "tools": [t if isinstance(t, dict) else t.model_dump() for t in fields.get("tools", [])],
                "temperature": fields.get("temperature"),
                "top_p": fields.get("top_p"),
                "max_output_tokens": fields.get("max_output_tokens"),
                "previous_response_id": previous,
                "usage": {
                    "input_tokens": usage.prompt_tokens,
                    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                    "output_tokens": usage.completion_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": usage.total_tokens,
                },
            }
        )
        item.completion = response
        return response
