"""Log-probs of generated tokens in OpenAI's two shapes, for whole answers and stream chunks alike.

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}`` (the
token's own bytes, possibly part of a character: ``detokenize.token_bytes``), where
``top_logprobs`` lists the ``top_logprobs`` most likely tokens at that position as
``{"token", "logprob", "bytes"}``, most likely first (empty when none were asked for). Legacy
completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where
``text_offset`` is where each token's text starts in the choice's text (the sum of the lengths of
the tokens before it) and ``top_logprobs`` holds per token a ``{token_text: logprob}`` object of
the ``logprobs: k`` most likely tokens (null per token for ``logprobs: 0``). Two alternatives that
decode to the same text (parts of one character, say) share one key there: the more likely one's
value is kept, so such an object may hold fewer than k entries (chat keeps every one, with bytes).

The alternatives come from the distribution the sampled token's logprob comes from (the logits
divided by the temperature, before filtering: ``top_logprobs.py``), so a sampled token among them
has the same value in both places.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.inference.server.detokenize import token_bytes
from areal_tasks.inference.server.top_logprobs import TopEntry

if TYPE_CHECKING:
    from areal_tasks.inference.server.request import Sequence

logger = logging.getLogger(__name__)


def alternatives(seq: Sequence, start: int = 0, end: int | None = None) -> list[TopEntry] | None:
    """The alternatives of ``seq``'s output tokens ``start:end``, or None where it asked for none."""
    return seq.output_top_logprobs[start:end] if seq.top_logprobs_num > 0 else None


def _chat_top(tokenizer: Any, top: TopEntry) -> list[dict[str, Any]]:
    return [{"token": tokenizer.decode([t]), "logprob": lp, "bytes": token_bytes(tokenizer, t)} for t, lp in top]


def _completion_top(tokenizer: Any, top: TopEntry) -> dict[str, float]:
    out: dict[str, float] = {}
    for t, lp in top:  # most likely first: a later token with the same text keeps the earlier value
        out.setdefault(tokenizer.decode([t]), lp)
    return out


def chat_logprobs(
    tokenizer: Any, ids: list[int], logprobs: list[float], tops: list[TopEntry] | None = None
) -> dict[str, Any]:
    """The chat ``logprobs`` object of tokens ``ids`` with their log-probs and, with ``tops``
    (aligned with ``ids``), each position's alternatives."""
    return {
        "content": [
            {
                "token": tokenizer.decode([t]),
                "logprob": lp,
                "bytes": token_bytes(tokenizer, t),
                "top_logprobs": _chat_top(tokenizer, tops[i]) if tops else [],
            }
            for i, (t, lp) in enumerate(zip(ids, logprobs))
        ]
    }


def completion_logprobs(
    tokenizer: Any,
    ids: list[int],
    logprobs: list[float],
    text_offset: int = 0,
    tops: list[TopEntry] | None = None,
) -> tuple[dict[str, Any], int]:
    """The legacy ``logprobs`` object of tokens ``ids`` whose text starts at ``text_offset`` (with
    ``tops``, aligned with ``ids``, each position's alternatives), and the offset after them
    (where a next chunk's tokens start)."""
    tokens = [tokenizer.decode([t]) for t in ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    body = {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "top_logprobs": [_completion_top(tokenizer, top) for top in tops] if tops else [None] * len(tokens),
        "text_offset": offsets,
    }
    return body, text_offset
