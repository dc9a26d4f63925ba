"""The OpenAI stream's chunks, driven step by step without a server: incremental text that never
splits a character, stop strings held back, log-probs chunked, finish and usage chunks, token bytes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from areal_tasks.inference.server import openai_stream
from areal_tasks.inference.server.detokenize import IncrementalDetokenizer, token_bytes
from areal_tasks.inference.server.openai_stream import DONE, OpenAIStream
from areal_tasks.inference.server.request import Sequence, SequenceGroup, finish_length, finish_matched
from areal_tasks.inference.server.sampling import SamplingParams

#: the test sequence grows by a token this often (the stream polls every millisecond).
GROW_EVERY_S = 0.005
TEXT = "héllo 你好 world, and more words"


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2: Path):
    return AutoTokenizer.from_pretrained(tiny_qwen2)


def test_incremental_text_never_splits_a_character(tokenizer) -> None:
    ids = tokenizer.encode(TEXT)
    assert any(tokenizer.decode([t]) == "\ufffd" for t in ids), "the tiny vocabulary splits characters"
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.advance(ids[:k]) for k in range(1, len(ids) + 1)]
    assert "".join(deltas) == TEXT and all("\ufffd" not in d for d in deltas)
    assert bytes(b for t in ids for b in token_bytes(tokenizer, t)).decode() == TEXT


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_stream, "STREAM_POLL_S", 0.001)


def _alternatives(token: int) -> list[tuple[int, float]]:
    """The test's made-up alternatives of ``token``: itself first, then two others."""
    return [(token, -0.5), (token + 1, -1.5), (token + 2, -2.5)]


def _events(tokenizer, ids: list[int], stop: tuple[str, ...], final: str, chat: bool, top: int = 0) -> list[dict]:
    """Run a stream over a sequence that grows by one token between polls, then finishes; with
    ``top``, each token's alternatives arrive a poll after the token (as the engine appends them
    after the whole step's tokens)."""

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        params = SamplingParams(stop=stop, max_new_tokens=len(ids))
        seq = Sequence(
            rid="r",
            group=SequenceGroup(prompt_ids=[1, 2, 3]),
            params=params,
            on_finish=lambda s: None,
            top_logprobs_num=top,
        )
        future = loop.create_future()
        stream = OpenAIStream(
            tokenizer=tokenizer,
            seqs=[seq],
            futures=[future],
            final_text=lambda s: final,
            chat=chat,
            logprobs=True,
            include_usage=True,
            prompt_tokens=3,
            envelope={"id": "x", "object": "chunk"},
        )

        async def grow() -> None:  # a token every few polls, then the finish
            for token in ids:
                await asyncio.sleep(GROW_EVERY_S)
                seq.append(token, -0.5)
                if top:
                    await asyncio.sleep(GROW_EVERY_S / 2)
                    seq.output_top_logprobs.append(_alternatives(token)[:top])
            await asyncio.sleep(GROW_EVERY_S)
            seq.finish_reason = finish_matched(stop[0]) if stop else finish_length(len(ids))
            future.set_result(seq)

        grower = asyncio.ensure_future(grow())
        out = [event async for event in stream.events()]
        await grower
        return out

    raw = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert raw[-1] == DONE and all(e.startswith(b"data: {") and e.endswith(b"\n\n") for e in raw[:-1])
    return [json.loads(e[len(b"data: ") :]) for e in raw[:-1]]


def test_chat_stream_chunks_text_and_logprobs_then_finish_and_usage(tokenizer) -> None:
    ids = tokenizer.encode(TEXT)
    events = _events(tokenizer, ids, (), TEXT, chat=True)
    assert events[0]["choices"][0]["delta"] == {"content": "", "role": "assistant"}
    deltas = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(d["delta"].get("content", "") for d in deltas) == TEXT
    content_chunks = [d for d in deltas if d["delta"].get("content")]
    assert len(content_chunks) > 3, "the text went out as it grew"
    entries = [entry for d in deltas if d["logprobs"] for entry in d["logprobs"]["content"]]
    assert [bytes(e["bytes"]) for e in entries] == [bytes(token_bytes(tokenizer, t)) for t in ids]
    assert all(e["logprob"] == -0.5 and e["top_logprobs"] == [] for e in entries)
    assert deltas[-1]["finish_reason"] == "length" and deltas[-1]["delta"] == {}
    assert [d["finish_reason"] for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": len(ids),
        "total_tokens": 3 + len(ids),
    }


def test_completion_stream_holds_back_what_a_stop_string_trims(tokenizer) -> None:
    stop = "world, and"  # four tokens
    ids = tokenizer.encode(TEXT)
    # the engine finishes the sequence at the token that completes the stop string
    ids = ids[: next(k for k in range(len(ids) + 1) if stop in tokenizer.decode(ids[:k]))]
    final = TEXT[: TEXT.index(stop)]
    events = _events(tokenizer, ids, (stop,), final, chat=False)
    choices = [e["choices"][0] for e in events if e["choices"]]
    streamed = ""
    for choice in choices:
        streamed += choice["text"]
        assert final.startswith(streamed), "a chunk sent text that the stop string trims"
    assert streamed == final and choices[-1]["finish_reason"] == "stop"
    offsets = [o for c in choices if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert len(tokens) == len(ids) and offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_streamed_alternatives_go_out_with_their_tokens(tokenizer) -> None:
    """Chat ``top_logprobs`` entries ``{token, logprob, bytes}`` and completions' ``{text: logprob}``
    objects, one per token, in the chunk that carries it, though they reach the sequence later."""
    ids = tokenizer.encode(TEXT)
    events = _events(tokenizer, ids, (), TEXT, chat=True, top=3)
    entries = [
        e
        for ev in events
        if ev["choices"] and ev["choices"][0]["logprobs"]
        for e in ev["choices"][0]["logprobs"]["content"]
    ]
    assert len(entries) == len(ids)
    for entry, token in zip(entries, ids):
        want = [
            {"token": tokenizer.decode([t]), "logprob": lp, "bytes": token_bytes(tokenizer, t)}
            for t, lp in _alternatives(token)
        ]
        assert entry["top_logprobs"] == want and entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    events = _events(tokenizer, ids, (), TEXT, chat=False, top=2)
    tops = [
        t
        for ev in events
        if ev["choices"] and ev["choices"][0]["logprobs"]
        for t in ev["choices"][0]["logprobs"]["top_logprobs"]
    ]
    assert len(tops) == len(ids)
    for top, token in zip(tops, ids):
        want: dict[str, float] = {}
        for t, lp in _alternatives(token)[:2]:
            want.setdefault(tokenizer.decode([t]), lp)
        assert top == want
