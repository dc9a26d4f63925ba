"""Fakes for the workflow tests: a character-level ChatML tokenizer and a scripted InferenceEngine.

``FakeTokenizer`` maps each character to one token (``10 + ord(c)``) and the ChatML special tokens
to 0-2, with the same template shape as the tiny kit's. ``FakeEngine`` answers requests from a
script of :class:`Reply` objects (the last one repeats), with deterministic logprobs and versions,
truncates to the request's ``max_new_tokens`` like a real server, records every request and
response, and can hold a request on a gate so a test can cancel it mid-generation.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse, PauseMode
from areal_tasks.datasets.reward import arithmetic_reward

SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
EOS = SPECIALS["<|im_end|>"]
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class FakeTokenizer:
    """One token per character; ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` are 0, 1, 2."""

    eos_token_id = EOS
    all_special_ids = sorted(SPECIALS.values())

    def __init__(self, drop_old_assistant_turns: bool = False) -> None:
        #: render earlier assistant turns as empty once a user turn follows (not append-only).
        self.drop_old_assistant_turns = drop_old_assistant_turns

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for piece in _SPLIT.split(text):
            ids.extend([SPECIALS[piece]] if piece in SPECIALS else [10 + ord(c) for c in piece])
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        out = []
        for t in ids:
            if t in names:
                out.append("" if skip_special_tokens else names[t])
            else:
                out.append(chr(t - 10))
        return "".join(out)

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool = True, add_generation_prompt: bool = False, **_: Any
    ) -> str | list[int]:
        text = ""
        for i, message in enumerate(messages):
            content = message["content"]
            later_user = any(m["role"] == "user" for m in messages[i + 1 :])
            if message["role"] == "assistant" and self.drop_old_assistant_turns and later_user:
                content = ""
            text += f"<|im_start|>{message['role']}\n{content}<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text


@dataclass(frozen=True)
class Reply:
    """One scripted answer: text, whether it ends with EOS, and how its tokens' versions are set.

    ``versions="engine"`` tags every token with the engine's version; ``"mixed"`` tags the first
    half 3 and the rest 4 (a weight update mid-generation: ``[3, 3, 4, 4]`` for four tokens).
    """

    text: str
    eos: bool = True
    versions: Literal["engine", "mixed"] = "engine"


class FakeEngine(InferenceEngine):
    """Scripted generation: call ``i`` answers ``script[min(i, len(script) - 1)]``."""

    def __init__(self, tokenizer: Any, script: Sequence[Reply], version: int = 7, gate_call: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.script = list(script)
        self.version = version
        self.requests: list[ModelRequest] = []
        self.responses: list[ModelResponse] = []
        #: the call index held until ``gate`` is set (None: no call waits).
        self.gate_call = gate_call
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    def output_ids(self, reply: Reply) -> list[int]:
        ids = [int(t) for t in self.tokenizer.encode(reply.text, add_special_tokens=False)]
        return [*ids, int(self.tokenizer.eos_token_id)] if reply.eos else ids

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        call = len(self.requests)
        self.requests.append(req)
        if call == self.gate_call:
            self.waiting.set()
            await self.gate.wait()
        await asyncio.sleep(0)
        reply = self.script[min(call, len(self.script) - 1)]
        ids = self.output_ids(reply)
        stop = "stop" if reply.eos else "length"
        if len(ids) > req.sampling.max_new_tokens:
            ids, stop = ids[: req.sampling.max_new_tokens], "length"
        n = len(ids)
        versions = [3] * (n // 2) + [4] * (n - n // 2) if reply.versions == "mixed" else [self.version] * n
        logprobs = [-0.01 * (call + 1) - 0.001 * i for i in range(n)]
        response = ModelResponse(
            rid=req.rid,
            input_ids=list(req.input_ids),
            output_ids=ids,
            output_logprobs=logprobs,
            output_versions=versions,
            stop_reason=stop,
            ttft_s=0.01,
            latency_s=0.5 + call,
            n_resubmits=call % 2,
        )
        self.responses.append(response)
        return response

    async def pause(self, mode: PauseMode = "abort") -> None:
        pass

    async def resume(self) -> None:
        pass

    async def update_weights(self, meta: Any, buckets: Any = None) -> None:
        pass

    def get_version(self) -> int:
        return self.version

    def set_version(self, version: int) -> None:
        self.version = version

    async def aclose(self) -> None:
        pass


async def arith_reward(completion: str, answer: str) -> float:
    """The built-in arithmetic reward as an async reward function."""
    return arithmetic_reward(completion, answer)


def generated(values: Sequence[Any], loss_mask: Sequence[int]) -> list[Any]:
    """The entries of ``values`` where ``loss_mask`` is 1."""
    return [v for v, m in zip(values, loss_mask) if m]


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    """The tiny kit's real tokenizer (ChatML template, byte-level BPE); built once, then cached."""
    from areal_tasks.models.tokenizer import load_tokenizer

    return load_tokenizer("tiny")


def tokenizer_by_name(name: str) -> Any:
    """``"fake"`` -> :class:`FakeTokenizer`; ``"tiny"`` -> the tiny kit's tokenizer."""
    return FakeTokenizer() if name == "fake" else tiny_tokenizer()
