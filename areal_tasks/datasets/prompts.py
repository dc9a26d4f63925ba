"""Prompt rendering through the tokenizer's chat template (system + user turns).

``render_prompt`` gives the token ids a policy generates from (``add_generation_prompt=True``);
``render_transcript`` gives a whole SFT transcript and a 0/1 mask over it that is 1 exactly on the
assistant's tokens (content and end-of-turn token), from the template's ``{% generation %}`` block
(``return_assistant_tokens_mask``). The tokenizer is any ``transformers`` tokenizer with such a
template; nothing here imports torch.
"""

from __future__ import annotations

import logging
from typing import Any

from areal_tasks.datasets.answers import ANSWER_FORMAT
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = f"Solve the problem. Reply with '{ANSWER_FORMAT}'."


def _messages(prompt: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": prompt}]


def render_prompt(tokenizer: Any, prompt: str, system: str | None = SYSTEM_PROMPT) -> list[int]:
    """Token ids of the system + user turns followed by the assistant header."""
    ids = tokenizer.apply_chat_template(_messages(prompt, system), tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def render_transcript(
    tokenizer: Any, prompt: str, response: str, system: str | None = SYSTEM_PROMPT
) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of system + user + assistant(``response``)."""
    messages = [*_messages(prompt, system), {"role": "assistant", "content": response}]
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids = [int(t) for t in out["input_ids"]]
    mask = [int(m) for m in out["assistant_masks"]]
    if len(mask) != len(ids) or not any(mask):
        raise ConfigError(
            "the tokenizer's chat template marks no assistant tokens; it needs a {% generation %} block "
            "around the assistant content for SFT loss masking"
        )
    return ids, mask
