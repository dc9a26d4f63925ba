"""Token bookkeeping shared by the workflows: trajectory building and chat-template segments.

:class:`TrajectoryBuilder` grows one token sequence piece by piece (the prompt, generated turns,
untrained context such as feedback turns) and keeps ``loss_mask``, ``logprobs`` and ``versions``
aligned with it, following :mod:`areal_tasks.api.workflow`.

:func:`feedback_segment` derives, from the tokenizer's chat template alone, the tokens that follow
a generated assistant turn when a user turn is appended: the rest of the assistant turn's closing
(e.g. ``<|im_end|>\\n`` in ChatML, minus the end-of-turn token the model already generated) and the
user turn plus the next assistant header. Generated tokens are never re-rendered (a template may
tokenise the assistant text differently from what the model sampled), so a multi-turn sequence is
always a strict extension of what the policy saw.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_tasks.api.inference import ModelResponse
from areal_tasks.api.workflow import Trajectory
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["FeedbackSegment", "TrajectoryBuilder", "chat_ids", "chat_text", "feedback_segment"]

#: stand-ins rendered through the template to find where the turn delimiters are.
_PLACEHOLDER_USER = "placeholder question"
_PLACEHOLDER_ASSISTANT = "placeholder reply 7q3z"


class TrajectoryBuilder:
    """One growing sequence with its per-token training lists; :meth:`build` makes the Trajectory."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.input_ids: list[int] = [int(t) for t in prompt_ids]
        self.loss_mask: list[int] = [0] * len(self.input_ids)
        self.logprobs: list[float] = [0.0] * len(self.input_ids)
        self.versions: list[int] = [-1] * len(self.input_ids)
        self.prompt_len = len(self.input_ids)

    def __len__(self) -> int:
        return len(self.input_ids)

    def add_context(self, ids: Sequence[int]) -> None:
        """Append tokens the policy did not generate (feedback, tool results): never trained."""
        self.input_ids.extend(int(t) for t in ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def add_generated(self, response: ModelResponse) -> None:
        """Append a response's output tokens with their behaviour logprobs and policy versions."""
        self.input_ids.extend(int(t) for t in response.output_ids)
        self.loss_mask.extend([1] * response.output_len)
        self.logprobs.extend(float(lp) for lp in response.output_logprobs)
        self.versions.extend(int(v) for v in response.output_versions)

    def build(self, reward: float, metadata: dict[str, Any]) -> Trajectory:
        """The validated :class:`Trajectory` of everything appended so far (lists are copied)."""
        return Trajectory(
            input_ids=list(self.input_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            reward=float(reward),
            prompt_len=self.prompt_len,
            metadata=dict(metadata),
        ).validate()


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def chat_text(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """Text of ``messages`` rendered by the tokenizer's chat template."""
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt))


@dataclass(frozen=True)
class FeedbackSegment:
    """Template tokens between a generated assistant turn and the next generated turn.

    ``closer_ids`` end an assistant turn as the template writes them (ChatML: ``<|im_end|>``,
    ``\\n``); ``turn_ids`` are the user turn plus the next assistant header.
    """

    closer_ids: tuple[int, ...]
    turn_ids: tuple[int, ...]

    def after(self, output_ids: Sequence[int]) -> list[int]:
        """Untrained tokens to append after ``output_ids`` (one generated turn) before the next turn.

        The longest head of ``closer_ids`` that the model already generated (usually its end-of-turn
        token) is not repeated; a turn cut by the length limit gets the whole closer.
        """
        closer = list(self.closer_ids)
        tail = list(output_ids[-len(closer) :]) if closer else []
        for k in range(min(len(closer), len(tail)), 0, -1):
            if tail[-k:] == closer[:k]:
                return closer[k:] + list(self.turn_ids)
        return closer + list(self.turn_ids)


def _closer_ids(tokenizer: Any, ids: list[int], closer_text: str) -> list[int]:
    """The tokens at the end of ``ids`` that spell ``closer_text`` (in-context), else its encoding."""
    if not closer_text:
        return []
    for k in range(1, len(ids) + 1):
        if tokenizer.decode(ids[-k:], skip_special_tokens=False) == closer_text:
            return ids[-k:]
    return [int(t) for t in tokenizer.encode(closer_text, add_special_tokens=False)]


def feedback_segment(tokenizer: Any, feedback: str, system: str | None) -> FeedbackSegment:
    """Derive the :class:`FeedbackSegment` of a user turn saying ``feedback`` from the chat template.

    Renders ``[system, user, assistant]`` and ``[system, user, assistant, user(feedback)]`` (the
    second with the generation prompt) and takes the difference, as token ids where the first
    rendering is a token prefix of the second, else as text (then tokenised). Raises
    :class:`ConfigError` when the template does not extend a conversation by appending.
    """
    head = [{"role": "system", "content": system}] if system else []
    before = [
        *head,
        {"role": "user", "content": _PLACEHOLDER_USER},
        {"role": "assistant", "content": _PLACEHOLDER_ASSISTANT},
    ]
    after = [*before, {"role": "user", "content": feedback}]
    text_before = chat_text(tokenizer, before, add_generation_prompt=False)
    at = text_before.rfind(_PLACEHOLDER_ASSISTANT)
    if at < 0:
        raise ConfigError(
            "the chat template dropped the assistant message's content; it cannot render multi-turn episodes"
        )
    ids_before = chat_ids(tokenizer, before, add_generation_prompt=False)
    ids_after = chat_ids(tokenizer, after, add_generation_prompt=True)
    closer = _closer_ids(tokenizer, ids_before, text_before[at + len(_PLACEHOLDER_ASSISTANT) :])
    if ids_after[: len(ids_before)] == ids_before and len(ids_after) > len(ids_before):
        turn = ids_after[len(ids_before) :]
    else:
        text_after = chat_text(tokenizer, after, add_generation_prompt=True)
        if not text_after.startswith(text_before):
            raise ConfigError(
                "the chat template renders earlier turns differently once a user turn follows; "
                "multi-turn episodes need a template that extends a conversation by appending"
            )
        logger.debug("chat template: the feedback turn is not a token-level extension; tokenising its text")
        turn = [int(t) for t in tokenizer.encode(text_after[len(text_before) :], add_special_tokens=False)]
    if not turn:
        raise ConfigError("the chat template rendered an empty feedback turn")
    return FeedbackSegment(tuple(closer), tuple(turn))
