"""The official SDK's objects for finished generations: ``ChatCompletion``, ``Completion`` and, for
``stream=True``, their chunks.

:func:`decode_output` turns one :class:`~areal_tasks.api.inference.ModelResponse` into what the agent
receives: the text of the output ids without the trailing stop token (EOS or another special or
stop token, which the interaction records as ``ended_with``), cut before the first stop string (the
recorded ids keep what the model sampled), and OpenAI's finish reason. Log-probs are the sampled
tokens' own, in OpenAI's shapes (the embedded server's ``openai_logprobs`` builds them).

The in-process client streams *after* generation: the chunks are cut from the finished answer
(role chunk, content deltas token by token with their log-probs, tool-call deltas with their
``index``, a finish chunk, a usage chunk when ``stream_options.include_usage``); their concatenated
content equals the non-streamed content.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.completion_choice import Logprobs

from areal_tasks.api.inference import ModelResponse
from areal_tasks.errors import AgentError

logger = logging.getLogger(__name__)

__all__ = [
    "Decoded",
    "chat_chunks",
    "chat_completion",
    "completion_chunks",
    "decode_output",
    "text_completion",
    "usage",
]


@dataclass(frozen=True)
class Decoded:
    """One generation as the agent sees it."""

    response: ModelResponse
    #: the output ids the text stands for (the trailing stop token removed).
    ids: list[int]
    text: str
    #: the stop token the output ends with, or None.
    ended_with: int | None
    finish_reason: str


def decode_output(tokenizer: Any, response: ModelResponse, stop: Iterable[str], stop_ids: set[int]) -> Decoded:
    """The text and finish reason of ``response`` (see the module doc)."""
    if response.stop_reason == "abort":
        raise AgentError(f"generation {response.rid} was aborted by the inference engine")
    ids = list(response.output_ids)
    ended_with = None
    if response.stop_reason == "stop" and ids and ids[-1] in stop_ids:
        ended_with = ids.pop()
    text = tokenizer.decode(ids, skip_special_tokens=False)
    cuts = [at for at in (text.find(s) for s in stop if s) if at >= 0]
    if cuts:
        text = text[: min(cuts)]
    return Decoded(response, ids, text, ended_with, "length" if response.stop_reason == "length" else "stop")


def _chat_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> ChoiceLogprobs:
    from areal_tasks.inference.server.openai_logprobs import chat_logprobs

    return ChoiceLogprobs.model_validate(chat_logprobs(tokenizer, ids, logprobs))


def usage(prompt_tokens: int, decoded: list[Decoded]) -> CompletionUsage:
    """Token counts of an answer: the prompt counted once per prompt, every choice's output."""
    out = sum(len(d.response.output_ids) for d in decoded)
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=out, total_tokens=prompt_tokens + out)


def chat_completion(
    cid: str,
    created: int,
    model: str,
    messages: list[dict[str, Any]],
    decoded: list[Decoded],
    finish: list[str],
    prompt_tokens: int,
    tokenizer: Any,
    logprobs: bool,
) -> ChatCompletion:
    """The ``ChatCompletion`` of ``n`` choices (``messages[i]`` is choice i's returned message)."""
    choices = [
        Choice(
            index=i,
            message=ChatCompletionMessage.model_validate(message),
            finish_reason=reason,  # type: ignore[arg-type]
            logprobs=_chat_logprobs(tokenizer, d.ids, d.response.output_logprobs[: len(d.ids)]) if logprobs else None,
        )
        for i, (message, d, reason) in enumerate(zip(messages, decoded, finish))
    ]
    return ChatCompletion(
        id=cid,
        choices=choices,
        created=created,
        model=model,
        object="chat.completion",
        usage=usage(prompt_tokens, decoded),
    )


def text_completion(
    cid: str, created: int, model: str, decoded: list[Decoded], prompt_tokens: int, tokenizer: Any, logprobs: bool
) -> Completion:
    """The legacy ``Completion`` of every (prompt, sample) choice, prompt-major."""
    from areal_tasks.inference.server.openai_logprobs import completion_logprobs

    choices = []
    for i, d in enumerate(decoded):
        lp = None
        if logprobs:
            body, _ = completion_logprobs(tokenizer, d.ids, d.response.output_logprobs[: len(d.ids)])
            lp = Logprobs.model_validate({**body, "top_logprobs": None})  # the SDK types no per-token None
        choices.append(CompletionChoice(index=i, text=d.text, finish_reason=d.finish_reason, logprobs=lp))  # type: ignore[arg-type]
    return Completion(
        id=cid,
        choices=choices,
        created=created,
        model=model,
        object="text_completion",
        usage=usage(prompt_tokens, decoded),
    )


def _pieces(tokenizer: Any, ids: list[int], content: str) -> list[tuple[str, list[int]]]:
    """``content`` cut at token boundaries: (text, token positions) pieces whose texts join to it."""
    pieces: list[tuple[str, list[int]]] = []
    emitted, pending = 0, []
    for k in range(len(ids)):
        pending.append(k)
        text = tokenizer.decode(ids[: k + 1], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            continue  # part of a character: wait for the rest
        upto = min(len(text), len(content))
        if upto > emitted and content[:upto] == text[:upto]:
            pieces.append((content[emitted:upto], pending))
            emitted, pending = upto, []
    if emitted < len(content) or pending:
        pieces.append((content[emitted:], pending))
    return pieces


async def chat_chunks(
    completion: ChatCompletion, decoded: list[Decoded], tokenizer: Any, include_usage: bool
) -> AsyncIterator[ChatCompletionChunk]:
    """The chunks of a finished ``completion``, choice after choice (see the module doc)."""

    def chunk(choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        head = {"id": completion.id, "created": completion.created, "model": completion.model}
        return ChatCompletionChunk(**head, object="chat.completion.chunk", choices=choices, **extra)

    for choice, d in zip(completion.choices, decoded):
        i, msg, want = choice.index, choice.message, choice.logprobs is not None
        yield chunk([ChunkChoice(index=i, delta=ChoiceDelta(role="assistant", content=""))])
        lp = choice.logprobs.content if choice.logprobs else None
        if msg.tool_calls:
            pieces = [(msg.content or "", list(range(len(d.ids))))] if msg.content or want else []
        else:
            pieces = _pieces(tokenizer, d.ids, msg.content or "")
        for text, positions in pieces:
            logprobs = ChunkLogprobs(content=[lp[k] for k in positions]) if lp is not None else None
            yield chunk([ChunkChoice(index=i, delta=ChoiceDelta(content=text), logprobs=logprobs)])
        for k, call in enumerate(msg.tool_calls or []):
            delta = ChoiceDeltaToolCall.model_validate({"index": k, **call.model_dump()})
            yield chunk([ChunkChoice(index=i, delta=ChoiceDelta(tool_calls=[delta]))])
        yield chunk([ChunkChoice(index=i, delta=ChoiceDelta(), finish_reason=choice.finish_reason)])
    if include_usage:
        yield chunk([], usage=completion.usage)


async def completion_chunks(completion: Completion, include_usage: bool) -> AsyncIterator[Completion]:
    """The chunks of a finished text ``completion``: one per choice (its text and finish reason),
    then the usage chunk when asked for."""
    head = {"id": completion.id, "created": completion.created, "model": completion.model, "object": "text_completion"}
    for choice in completion.choices:
        yield Completion(**head, choices=[choice])
    if include_usage:
        yield Completion(**head, choices=[], usage=completion.usage)
