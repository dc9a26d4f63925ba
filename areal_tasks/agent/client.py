"""``ArealOpenAI``: an in-process stand-in for ``openai.AsyncOpenAI`` that generates through the job's
inference engine and records every completion for training.

Agent code calls ``await client.chat.completions.create(...)``, ``client.completions.create(...)``
or ``client.responses.create(...)`` (``responses.py``) exactly as with the official SDK and gets the
SDK's own pydantic objects back. Each call renders its prompt with the tokenizer's chat template
(``chat_render.py``; a request that extends an earlier call's conversation reuses that call's prompt
and output ids plus a bridge, so nothing the model produced is re-tokenised), generates ``n``
requests through ``engine.agenerate`` (sampling defaults from ``sampling``; ``seed + j`` for sample
``j``), parses tool calls (``tool_calls.py``) and records one
:class:`~areal_tasks.agent.interactions.Interaction` per choice in :attr:`ArealOpenAI.cache`.
Request fields are checked by ``requests.py``: what cannot be honoured raises
:class:`~areal_tasks.errors.AgentRequestError` naming the field. ``stream=True`` returns an async
iterator of chunks cut from the finished generation (``completions.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from areal_tasks.agent.chat_render import ChatRenderer, normalize_messages
from areal_tasks.agent.completions import (
    Decoded,
    chat_chunks,
    chat_completion,
    completion_chunks,
    decode_output,
    text_completion,
)
from areal_tasks.agent.interactions import Interaction, InteractionCache
from areal_tasks.agent.requests import check_unsupported, present_fields, sampling_params
from areal_tasks.agent.tool_calls import TOOL_CALL_PARSERS, ToolPolicy, resolve_tool_choice
from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_tasks.errors import AgentError, AgentRequestError

logger = logging.getLogger(__name__)

__all__ = ["ArealOpenAI"]


def _choice_id(cid: str, index: int) -> str:
    return cid if index == 0 else f"{cid}-{index}"


class ArealOpenAI:
    """``openai.AsyncOpenAI``'s ``chat.completions``, ``completions`` and ``responses``, in-process."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        cache: InteractionCache | None = None,
        tool_call_parser: str | None = "hermes",
        chat_template_kwargs: dict[str, Any] | None = None,
        model_name: str = "areal",
    ) -> None:
        if tool_call_parser is not None and tool_call_parser not in TOOL_CALL_PARSERS:
            raise AgentError(f"tool_call_parser={tool_call_parser!r} must be None or one of {TOOL_CALL_PARSERS}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.cache = cache if cache is not None else InteractionCache()
        self.tool_call_parser = tool_call_parser
        self.renderer = ChatRenderer(tokenizer, chat_template_kwargs)
        self.model_name = model_name
        self.chat = _Chat(self)
        self.completions = _Completions(self)
        from areal_tasks.agent.responses import Responses

        self.responses = Responses(self)

    # ---------------- generation ----------------
    def _stop_ids(self, params: SamplingParams) -> set[int]:
        ids = set(params.stop_token_ids) | set(getattr(self.tokenizer, "all_special_ids", []) or [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Decoded]:
        """``n`` generations of ``prompt_ids`` (sample ``j`` seeded ``seed + j``), decoded."""
        requests = [
            ModelRequest(list(prompt_ids), params if params.seed is None else replace(params, seed=params.seed + j))
            for j in range(n)
        ]
        responses: list[ModelResponse] = await asyncio.gather(*(self.engine.agenerate(r) for r in requests))
        stop_ids = self._stop_ids(params)
        return [decode_output(self.tokenizer, r, params.stop, stop_ids) for r in responses]

    def _tool_policy(self, fields: dict[str, Any]) -> ToolPolicy:
        policy = resolve_tool_choice(fields.get("tools"), fields.get("tool_choice"), fields.get("parallel_tool_calls"))
        return policy if self.tool_call_parser else replace(policy, parse=False)

    async def chat_turn(
        self, messages: list[Any], fields: dict[str, Any], cid: str | None = None
    ) -> tuple[ChatCompletion, list[Decoded], list[Interaction]]:
        """Render, generate and record one chat request (already field-checked) under id ``cid``
        (a fresh ``chatcmpl-<hex>`` by default)."""
        msgs = normalize_messages(messages)
        if not msgs:
            raise AgentRequestError("messages must not be empty", param="messages")
        policy = self._tool_policy(fields)
        kwargs = fields.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise AgentRequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
        text = self.renderer.text(msgs, policy.tools, chat_template_kwargs=kwargs)
        parent = self.cache.parent_of(msgs)
        bridge = None
        if parent is not None and parent.message is not None:
            bridge = self.renderer.bridge(
                parent.messages, parent.prompt_text, parent.message, parent.ended_with, msgs, policy.tools, text, kwargs
            )
        if parent is not None and bridge is not None:
            prompt_ids = [*parent.prompt_ids, *parent.output_ids, *bridge]
        else:
            parent, prompt_ids = None, self.renderer.encode(text)
        params = sampling_params(self.sampling, fields, "max_tokens")
        decoded = await self.generate(prompt_ids, params, fields.get("n", 1))
        cid, created = cid or f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        returned, finish = [], []
        for d in decoded:
            content, calls = policy.split(d.text)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            returned.append(message)
            finish.append("tool_calls" if calls else d.finish_reason)
        completion = chat_completion(
            cid,
            created,
            self.model_name,
            returned,
            decoded,
            finish,
            len(prompt_ids),
            self.tokenizer,
            bool(fields.get("logprobs")),
        )
        items = [
            Interaction(
                id=_choice_id(cid, i),
                messages=msgs,
                prompt_text=text,
                prompt_ids=list(prompt_ids),
                output_ids=list(d.response.output_ids),
                output_logprobs=list(d.response.output_logprobs),
                output_versions=list(d.response.output_versions),
                message=message,
                finish_reason=reason,
                parent_id=parent.id if parent is not None else None,
                tools=policy.tools,
                ended_with=d.ended_with,
                completion=completion,
            )
            for i, (d, message, reason) in enumerate(zip(decoded, returned, finish))
        ]
        for item in items:
            self.cache.add(item)
        return completion, decoded, items

    async def text_turn(self, prompt: Any, fields: dict[str, Any]) -> Completion:
        """Generate and record one legacy completion request (every prompt, ``n`` samples each)."""
        prompts = _prompt_ids(prompt, self.renderer)
        logprobs = fields.get("logprobs")
        if logprobs is not None and logprobs is not False and logprobs != 0:
            raise AgentRequestError(
                "logprobs must be 0: only the sampled token's log-prob is returned", param="logprobs"
            )
        params = sampling_params(self.sampling, fields, "max_tokens")
        n = fields.get("n", 1)
        batches = await asyncio.gather(*(self.generate(ids, params, n) for ids in prompts))
        decoded = [d for batch in batches for d in batch]
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        completion = text_completion(
            cid,
            created,
            self.model_name,
            decoded,
            sum(len(p) for p in prompts),
            self.tokenizer,
            logprobs is not None,
        )
        for i, d in enumerate(decoded):
            ids = prompts[i // n]
            self.cache.add(
                Interaction(
                    id=_choice_id(cid, i),
                    messages=[],
                    prompt_text=self.tokenizer.decode(ids, skip_special_tokens=False),
                    prompt_ids=list(ids),
                    output_ids=list(d.response.output_ids),
                    output_logprobs=list(d.response.output_logprobs),
                    output_versions=list(d.response.output_versions),
                    message=None,
                    finish_reason=d.finish_reason,
                    ended_with=d.ended_with,
                    completion=completion,
                )
            )
        return completion


def _prompt_ids(prompt: Any, renderer: ChatRenderer) -> list[list[int]]:
    """A legacy ``prompt`` (text, texts, token ids or lists of them) as token id lists."""
    if isinstance(prompt, str):
        prompts = [renderer.encode(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [renderer.encode(p) for p in prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [[int(t) for t in p] for p in prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [[int(t) for t in prompt]]
    else:
        raise AgentRequestError("prompt must be a string, strings, token ids or lists of token ids", param="prompt")
    if not all(prompts):
        raise AgentRequestError("prompt must not be empty", param="prompt")
    return prompts


def _include_usage(fields: dict[str, Any]) -> bool:
    options = fields.get("stream_options") or {}
    if not fields.get("stream") and options:
        raise AgentRequestError("stream_options is only allowed with stream=true", param="stream_options")
    return bool(options.get("include_usage"))


class _ChatCompletions:
    def __init__(self, client: ArealOpenAI) -> None:
        self._client = client

    async def create(
        self, *, messages: list[Any], **kwargs: Any
    ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """``openai.AsyncOpenAI().chat.completions.create``: a ``ChatCompletion`` (chunks if ``stream``)."""
        fields = present_fields(kwargs)
        check_unsupported(fields)
        include_usage = _include_usage(fields)
        completion, decoded, _ = await self._client.chat_turn(messages, fields)
        if fields.get("stream"):
            return chat_chunks(completion, decoded, self._client.tokenizer, include_usage)
        return completion


class _Chat:
    def __init__(self, client: ArealOpenAI) -> None:
        self.completions = _ChatCompletions(client)


class _Completions:
    def __init__(self, client: ArealOpenAI) -> None:
        self._client = client

    async def create(self, *, prompt: Any, **kwargs: Any) -> Completion | AsyncIterator[Completion]:
        """``openai.AsyncOpenAI().completions.create``: a ``Completion`` (chunks if ``stream``)."""
        fields = present_fields(kwargs)
        check_unsupported(fields)
        include_usage = _include_usage(fields)
        completion = await self._client.text_turn(prompt, fields)
        if fields.get("stream"):
            return completion_chunks(completion, include_usage)
        return completion
