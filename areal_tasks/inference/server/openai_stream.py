"""``stream: true`` on the OpenAI routes: Server-Sent Events of ``chat.completion.chunk`` or
``text_completion`` objects, as the official ``openai`` SDK parses them.

The request's sequences are queued before the answer starts (a refusal is still an ordinary 4xx),
then :class:`OpenAIStream` watches them: every :data:`STREAM_POLL_S`, or at once when one finishes,
each choice's new tokens become a chunk tagged with the choice's ``index`` (``n`` samples and
several prompts interleave). A chat stream opens each choice with ``{"role": "assistant"}``. Text
comes from :class:`~areal_tasks.inference.server.detokenize.IncrementalDetokenizer` (never half a
character); with stop strings the last ``len(longest stop)`` characters wait, and the newest token
waits until the engine has checked its finish rules, so that no chunk carries text the finished
answer trims. A token's log-prob (and its alternatives, where the request asked for them) goes
out in the chunk that carries the token. When a sequence finishes, the rest of its text (the
server's final text, as the non-streamed answer has it) and its log-probs follow, then a chunk
with ``finish_reason`` and an empty delta. With tools and a tool-call parser the text is held to
the end and sent parsed, as ``content`` and ``tool_calls`` deltas. ``stream_options.include_usage``
adds a last chunk with ``usage`` and no choices; ``data: [DONE]`` ends the stream.

A client that goes away stops its generation: Starlette cancels the response when the client
disconnects, and :class:`SSEResponse` aborts every unfinished sequence of the request whatever way
the response ends (also when the stream never started).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from areal_tasks.inference.server.detokenize import IncrementalDetokenizer
from areal_tasks.inference.server.openai_logprobs import alternatives, chat_logprobs, completion_logprobs
from areal_tasks.inference.server.request import Sequence

logger = logging.getLogger(__name__)

#: how often a stream looks for new tokens of its sequences (a finish wakes it at once).
STREAM_POLL_S = 0.02
DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


def finish_of(seq: Sequence) -> tuple[str, Any]:
    """OpenAI's ``finish_reason`` of a finished sequence and SGLang's ``matched_stop``."""
    reason = seq.finish_reason or {}
    return reason.get("type", "stop"), reason.get("matched")


class SSEResponse(StreamingResponse):
    """A streaming answer that runs ``on_close`` once it ends, however it ends (finished,
    client gone, cancelled, failed)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


@dataclass
class _Choice:
    """What one choice's stream has sent so far."""

    index: int
    seq: Sequence
    future: asyncio.Future[Sequence]
    detok: IncrementalDetokenizer
    #: characters of ``detok.text`` sent, tokens whose log-probs were sent, completions' text offset.
    sent_chars: int = 0
    sent_tokens: int = 0
    text_offset: int = 0
    done: bool = False


@dataclass
class OpenAIStream:
    """The events of one streamed request (see the module doc). ``final_text(seq)`` is the
    server's text of a finished sequence; ``parse_tools(text)`` (chat with tools) splits it into
    content and tool calls."""

    tokenizer: Any
    seqs: list[Sequence]
    futures: list[asyncio.Future[Sequence]]
    final_text: Callable[[Sequence], str]
    chat: bool
    logprobs: bool
    include_usage: bool
    prompt_tokens: int
    envelope: dict[str, Any]
    parse_tools: Callable[[str], tuple[str | None, list[dict[str, Any]]]] | None = None
    _choices: list[_Choice] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._choices = [
            _Choice(i, seq, fut, IncrementalDetokenizer(self.tokenizer, seq.params.skip_special_tokens))
            for i, (seq, fut) in enumerate(zip(self.seqs, self.futures))
        ]

    # ---------------- chunks ----------------
    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse({**self.envelope, "choices": choices, **extra})

    def _choice(self, c: _Choice, text: str | None, ids: list[int], finish: str | None, **delta: Any) -> dict[str, Any]:
        seq = c.seq
        logprobs = None
        if self.logprobs and ids:
            end = c.sent_tokens + len(ids)
            values = seq.output_logprobs[c.sent_tokens : end]
            tops = alternatives(seq, c.sent_tokens, end)
            if self.chat:
                logprobs = chat_logprobs(self.tokenizer, ids, values, tops)
            else:
                logprobs, c.text_offset = completion_logprobs(self.tokenizer, ids, values, c.text_offset, tops)
        c.sent_tokens += len(ids)
        if self.chat:
            body = {**({} if text is None else {"content": text}), **delta}
            return {"index": c.index, "delta": body, "logprobs": logprobs, "finish_reason": finish}
        return {"index": c.index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}

    def _holdback(self, seq: Sequence) -> int:
        return max((len(s) for s in seq.params.stop), default=0)

    def _progress(self, c: _Choice) -> bytes | None:
        """A chunk of ``c``'s new text and tokens while it runs, or None."""
        seq = c.seq
        if seq.finished or self.parse_tools is not None:
            return None
        # the newest token may not have been checked against the finish rules yet: it waits
        ids = seq.output_ids[: len(seq.output_ids) - 1]
        c.detok.advance(ids)
        end = max(c.sent_chars, len(c.detok.text) - self._holdback(seq))
        text = c.detok.text[c.sent_chars : end]
        new_ids = ids[c.sent_tokens :] if self.logprobs else []
        if not text and not new_ids:
            return None
        c.sent_chars = end
        if not self.logprobs:
            c.sent_tokens = len(ids)
        return self._chunk([self._choice(c, text, new_ids, None)])

    def _finish(self, c: _Choice) -> list[bytes]:
        """The last chunks of a finished choice: the rest of its text and tokens, then its finish reason."""
        seq = c.future.result()
        final = self.final_text(seq)
        sent = c.detok.text[: c.sent_chars]
        if not final.startswith(sent):
            logger.warning("request %s: the streamed text is not a prefix of the final text", seq.rid)
        rest = final[len(sent) :]
        ids = list(seq.output_ids[c.sent_tokens :]) if self.logprobs else []
        reason, matched = finish_of(seq)
        events = []
        calls: list[dict[str, Any]] = []
        if self.parse_tools is not None:
            content, calls = self.parse_tools(final)
            rest = content or ""
        if rest or ids:
            events.append(self._chunk([self._choice(c, rest, ids, None)]))
        if calls:
            tool_calls = [{"index": k, **call} for k, call in enumerate(calls)]
            events.append(self._chunk([self._choice(c, None, [], None, tool_calls=tool_calls)]))
            reason = "tool_calls"
        last = self._choice(c, None if self.chat else "", [], reason)
        events.append(self._chunk([{**last, "matched_stop": matched}]))
        c.done = True
        return events

    def _usage(self) -> dict[str, int]:
        completion = sum(len(s.output_ids) for s in self.seqs)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    # ---------------- the stream ----------------
    async def events(self) -> AsyncIterator[bytes]:
        """The whole stream, ``[DONE]`` included."""
        if self.chat:
            for c in self._choices:
                yield self._chunk([self._choice(c, "", [], None, role="assistant")])
        while True:
            for c in self._choices:
                if c.done:
                    continue
                if c.future.done():
                    for event in self._finish(c):
                        yield event
                else:
                    event = self._progress(c)
                    if event is not None:
                        yield event
            pending = [c.future for c in self._choices if not c.done]
            if not pending:
                break
            await asyncio.wait(pending, timeout=STREAM_POLL_S, return_when=asyncio.FIRST_COMPLETED)
        if self.include_usage:
            yield self._chunk([], usage=self._usage())
        yield DONE
