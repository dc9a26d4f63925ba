"""Tool calls in OpenAI's shape: parsing a model's Hermes/Qwen2.5 ``<tool_call>`` blocks, and what
``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request mean here.

The format is the kit's chat template's and Qwen2.5's (Hermes style): each call is a block
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` in the assistant's text, ``arguments`` a
JSON object (or, from some models, a JSON string). :func:`parse_tool_calls` splits every well-formed
block off the text into an OpenAI tool call (``arguments`` always a JSON string, as the SDK expects);
a block that is not a JSON object with a string ``name`` (malformed, cut by the length limit) stays
in the content, so nothing the model wrote is lost.

:func:`resolve_tool_choice` decides, for a request, whether the tools are rendered into the prompt
and whether the output is parsed for calls. Decoding is never constrained (the engine samples
freely), so ``"required"`` and a named function (``{"type": "function", "function": {"name": ..}}``)
render the tools and parse the answer like ``"auto"``; a named function must be one of ``tools``
(else :class:`~areal_tasks.errors.AgentRequestError` naming ``tool_choice``). If the model answers
without a call anyway, the answer is returned as content with its own finish reason. ``"none"``
renders no tools and parses nothing. ``parallel_tool_calls=False`` keeps only the first call (the
recorded tokens still hold all that the model wrote). The embedded inference server's OpenAI routes
use the same parser.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from areal_tasks.errors import AgentRequestError

logger = logging.getLogger(__name__)

__all__ = ["TOOL_CALL_PARSERS", "ToolPolicy", "parse_tool_calls", "resolve_tool_choice"]

#: names of the one tool-call format parsed here (``hermes`` and ``qwen25`` are the same blocks).
TOOL_CALL_PARSERS: tuple[str, ...] = ("hermes", "qwen25")

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def new_call_id() -> str:
    """A fresh tool-call id in OpenAI's shape (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split Hermes/Qwen ``<tool_call>`` blocks off ``text``: (remaining content or None, tool calls).

    Every call is ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
    ``arguments`` a JSON string (an object is dumped as the chat templates write it: ``", "`` and
    ``": "`` separators, non-ASCII kept). A block that is not a JSON object with a string ``name``
    stays in the content. Without any call, ``text`` is returned unchanged; with calls, the content
    left around them is stripped (None when empty).
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            logger.debug("tool_call block is not JSON; kept as content")
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {"id": new_call_id(), "type": "function", "function": {"name": payload["name"], "arguments": arguments}}
        )
        return ""

    content = _TOOL_CALL.sub(take, text)
    if not calls:
        return text, []
    return content.strip() or None, calls


@dataclass(frozen=True)
class ToolPolicy:
    """What a request's ``tools``/``tool_choice``/``parallel_tool_calls`` mean for one generation."""

    #: the tools rendered into the prompt (None: render none).
    tools: list[dict[str, Any]] | None
    #: whether the output is parsed for tool calls.
    parse: bool
    #: whether more than one call may be returned.
    parallel: bool = True

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The content and the tool calls of a model's output ``text`` under this policy."""
        if not self.parse:
            return text, []
        content, calls = parse_tool_calls(text)
        if len(calls) > 1 and not self.parallel:
            logger.debug("parallel_tool_calls=false: keeping the first of %d tool calls", len(calls))
            calls = calls[:1]
        return content, calls


def _tool_names(tools: list[Any]) -> list[str]:
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise AgentRequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}; "
                "only function tools are served",
                param="tools",
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise AgentRequestError(f"tools[{i}].function.name must be a non-empty string", param="tools")
        names.append(fn["name"])
    return names


def resolve_tool_choice(
    tools: list[Any] | None, tool_choice: Any = None, parallel_tool_calls: bool | None = None
) -> ToolPolicy:
    """The :class:`ToolPolicy` of a chat request; raises AgentRequestError naming the bad field."""
    tools = [dict(t) for t in tools] if tools else []
    names = _tool_names(tools)
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    if tool_choice is None or tool_choice == "auto":
        return ToolPolicy(tools or None, bool(tools), parallel)
    if tool_choice == "none":
        return ToolPolicy(None, False, parallel)
    if not tools:
        raise AgentRequestError(f"tool_choice={tool_choice!r} needs tools; the request has none", param="tool_choice")
    if tool_choice == "required":
        return ToolPolicy(tools, True, parallel)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in names:
            raise AgentRequestError(
                f"tool_choice names function {name!r}, which is not among tools {names}", param="tool_choice"
            )
        return ToolPolicy(tools, True, parallel)
    raise AgentRequestError(
        f"tool_choice={tool_choice!r} is not 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}",
        param="tool_choice",
    )
