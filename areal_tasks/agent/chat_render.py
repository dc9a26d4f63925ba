"""Chat messages to prompt token ids with the tokenizer's chat template, incrementally across turns.

A fresh request is rendered whole (``messages``, ``tools``, ``chat_template_kwargs``, generation
prompt) and tokenised. A request that extends an earlier interaction (its messages, then the
assistant message returned for it, then new messages) is not re-rendered: its prompt is the parent's
prompt ids, the parent's output ids (exactly what the model sampled, never re-tokenised) and a
*bridge* tokenised from new text only. The bridge text comes from the template: render
``parent.messages + [returned message]`` (no generation prompt) and the new ``messages`` (with it);
the second must start with the first, and the bridge is the template's text after the model's
end-of-turn token (ChatML: ``"\\n"``) plus the rest of the new rendering. A model that stopped
without its end-of-turn token (length limit, stop string) gets the template's whole closing (ChatML:
``"<|im_end|>\\n"``) in the bridge, untrained. Where the template does not extend by appending
(e.g. one that drops earlier reasoning), the request is a new root (logged at debug).

Messages are normalised to plain dicts first (pydantic SDK objects dumped); tool calls' JSON-string
``arguments`` are rendered as objects (as vLLM does), so Qwen-style templates that ``tojson`` them
render the call as the model writes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from areal_tasks.errors import AgentRequestError

logger = logging.getLogger(__name__)

__all__ = ["ChatRenderer", "normalize_messages", "same_message"]


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    return value


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain-dict copies of ``messages`` (SDK pydantic objects dumped; None-valued keys dropped)."""
    out = []
    for i, raw in enumerate(messages):
        plain = _plain(raw)
        if not isinstance(plain, dict) or not isinstance(plain.get("role"), str):
            raise AgentRequestError(f"messages[{i}] must be an object with a 'role'", param="messages")
        message = {k: _plain(v) for k, v in plain.items() if v is not None}
        if "tool_calls" in message:
            message["tool_calls"] = [_plain(c) for c in message["tool_calls"] or []]
        out.append(message)
    return out


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _content(value: Any) -> Any:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(p.get("text", "") for p in value)
    return value


def _key(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        calls.append((call.get("id"), fn.get("name"), _arguments(fn.get("arguments"))))
    return (
        message.get("role"),
        _content(message.get("content")),
        calls,
        message.get("tool_call_id"),
        message.get("name"),
    )


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two messages render the same: role, content (None == ""), tool calls' id, name and
    arguments (JSON-equal), tool_call_id and name."""
    return _key(a) == _key(b)


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them: tool calls' string arguments parsed into objects."""
    out = []
    for message in messages:
        calls = []
        for call in message.get("tool_calls") or []:
            fn = dict(call.get("function", {}))
            fn["arguments"] = _arguments(fn.get("arguments", {}))
            calls.append({**call, "function": fn})
        out.append({**message, "tool_calls": calls} if calls else message)
    return out


class ChatRenderer:
    """Renders chats with one tokenizer's chat template (and fixed ``chat_template_kwargs``)."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})

    def text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The template's text of ``messages``; a template error is the request's fault (400 on messages)."""
        kwargs = {**self.kwargs, **(chat_template_kwargs or {})}
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    _for_template(messages),
                    tools=tools or None,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    **kwargs,
                )
            )
        except Exception as exc:  # jinja's raise_exception / TemplateError: the caller's messages are wrong
            raise AgentRequestError(f"chat template failed: {type(exc).__name__}: {exc}", param="messages") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (no special tokens added: the template wrote them)."""
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def bridge(
        self,
        parent_messages: list[dict[str, Any]],
        parent_prompt_text: str,
        returned: dict[str, Any],
        ended_with: int | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        new_text: str,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int] | None:
        """The bridge ids between a parent's output and the request ``messages`` (rendered as
        ``new_text``), or None when the template does not extend the parent's conversation.

        ``ended_with`` is the stop token the parent's output ends with (its end-of-turn token), or
        None when it stopped otherwise.
        """
        before = self.text(
            [*parent_messages, returned], tools, add_generation_prompt=False, chat_template_kwargs=chat_template_kwargs
        )
        if not before.startswith(parent_prompt_text) or not new_text.startswith(before):
            logger.debug("chat template does not extend the parent conversation by appending; a new root")
            return None
        turn = before[len(parent_prompt_text) :]
        closer = self.tokenizer.decode([ended_with]) if ended_with is not None else self.tokenizer.eos_token
        at = turn.rfind(closer) if closer else -1
        if at < 0:
            logger.debug("the template's assistant turn has no %r to end it; a new root", closer)
            return None
        closing = turn[at + len(closer) :] if ended_with is not None else turn[at:]
        return self.encode(closing + new_text[len(before) :])
