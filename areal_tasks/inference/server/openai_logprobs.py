"""Log-probs of generated tokens in OpenAI's two shapes, for whole answers and stream chunks alike.

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": []}, ...]}`` (the
token's own bytes, possibly part of a character: ``detokenize.token_bytes``). Legacy completions:
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where ``text_offset`` is where each
token's text starts in the choice's text (the sum of the lengths of the tokens before it).
``top_logprobs`` stays empty (chat) or null per token (completions): the sampler computes only the
sampled token's log-prob, so the routes refuse a request for alternatives (``openai_bodies.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from areal_tasks.inference.server.detokenize import token_bytes

logger = logging.getLogger(__name__)


def chat_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """The chat ``logprobs`` object of tokens ``ids`` with their log-probs."""
    return {
        "content": [
            {
                "token": tokenizer.decode([t]),
                "logprob": lp,
                "bytes": token_bytes(tokenizer, t),
                "top_logprobs": [],
            }
            for t, lp in zip(ids, logprobs)
        ]
    }


def completion_logprobs(
    tokenizer: Any, ids: list[int], logprobs: list[float], text_offset: int = 0
) -> tuple[dict[str, Any], int]:
    """The legacy ``logprobs`` object of tokens ``ids`` whose text starts at ``text_offset``, and
    the offset after them (where a next chunk's tokens start)."""
    tokens = [tokenizer.decode([t]) for t in ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    body = {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "top_logprobs": [None] * len(tokens),
        "text_offset": offsets,
    }
    return body, text_offset
