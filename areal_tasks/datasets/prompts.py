"""Prompt rendering through the tokenizer's chat template (system + user turns, optional tools).

``render_prompt`` gives the token ids a policy generates from (``add_generation_prompt=True``),
``render_chat`` the same for a whole chat (a record's ``messages``: the job's system prompt is put
first unless the chat has its own system message), ``render_record`` either for a record;
``render_messages`` gives a whole SFT transcript (any chat: several assistant turns, tool calls and
tool results) and a 0/1 mask over it that is 1 exactly on the assistant's tokens of *every*
assistant turn (content, tool calls and end-of-turn token), from the template's
``{% generation %}`` block (``return_assistant_tokens_mask``); ``render_transcript`` is the
single-turn case (system + user + one assistant response). The tokenizer is any ``transformers``
tokenizer with such a template; nothing here imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from areal_tasks.datasets.answers import ANSWER_FORMAT
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = f"Solve the problem. Reply with '{ANSWER_FORMAT}'."


def _messages(prompt: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": prompt}]


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    return [dict(t) for t in tools] if tools else None


def render_prompt(
    tokenizer: Any,
    prompt: str,
    system: str | None = SYSTEM_PROMPT,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of the system (with ``tools``, when given) + user turns followed by the assistant header."""
    return render_chat(tokenizer, [{"role": "user", "content": prompt}], system, tools)


def chat_messages(messages: Sequence[Mapping[str, Any]], system: str | None) -> list[dict[str, Any]]:
    """A record's chat with the job's ``system`` prompt first, unless the chat has a system message of
    its own (then the chat is kept as it is)."""
    chat = [dict(m) for m in messages]
    if not system or any(m.get("role") == "system" for m in chat):
        return chat
    return [{"role": "system", "content": system}, *chat]


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    system: str | None = SYSTEM_PROMPT,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of a chat (see :func:`chat_messages` for the system prompt) and the assistant header."""
    ids = tokenizer.apply_chat_template(
        chat_messages(messages, system), tools=_tools(tools), tokenize=True, add_generation_prompt=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def render_record(tokenizer: Any, record: Any, system: str | None = SYSTEM_PROMPT) -> list[int]:
    """Prompt token ids of a record: its ``messages`` when it has a chat, else its ``prompt`` text."""
    messages = getattr(record, "messages", None)
    if messages:
        return render_chat(tokenizer, messages, system, getattr(record, "tools", None))
    return render_prompt(tokenizer, record.prompt, system, getattr(record, "tools", None))


def render_transcript(
    tokenizer: Any, prompt: str, response: str, system: str | None = SYSTEM_PROMPT
) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of system + user + assistant(``response``)."""
    return render_messages(tokenizer, [*_messages(prompt, system), {"role": "assistant", "content": response}])


def render_messages(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of a whole chat (OpenAI message dicts; ``tools`` in the system turn)."""
    out = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=_tools(tools),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = [int(t) for t in out["input_ids"]]
    mask = [int(m) for m in out["assistant_masks"]]
    if len(mask) != len(ids) or not any(mask):
        raise ConfigError(
            "the tokenizer's chat template marks no assistant tokens; it needs a {% generation %} block "
            "around the assistant content for SFT loss masking"
        )
    return ids, mask
