"""OpenAI-compatible ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``.

Chat requests are rendered with the tokenizer's chat template: ``messages``, ``tools`` (omitted when
``tool_choice`` is ``"none"``, as SGLang does), ``add_generation_prompt`` and the
``chat_template_kwargs`` the server allows (``limits.py``: booleans, integers or short strings
under allowed names; never a template of the caller's). Rendering and tokenising run on the
server's tokenize lane within its time limit, after the text was measured against the context.
Bodies, the sampling fields and the refusals (400 in OpenAI's error shape naming the field) are
in ``openai_bodies.py``.

``n`` gives independent samples of each prompt (choice ``index`` prompt-major); ``logprobs`` gives
the sampled tokens' log-probs in OpenAI's shapes, with each position's most likely alternatives for
chat ``top_logprobs`` / completions ``logprobs: k`` (``openai_logprobs.py``); ``stream: true`` answers
Server-Sent Events (``openai_stream.py``). Every answer carries ``usage`` (prompt, completion, total
tokens; for ``n > 1`` the prompt counts once) and SGLang's ``metadata.weight_version``. With the
server's ``tool_call_parser`` set (``hermes``/``qwen25``: Hermes/Qwen style
``<tool_call>{"name", "arguments"}</tool_call>`` blocks, parsed by ``areal_tasks.agent.tool_calls``),
tool calls in the output are returned as ``message.tool_calls`` with finish reason ``tool_calls``.

Chat messages may carry images as ``image_url`` content parts with ``data:`` URLs
(``openai_images.py``); the template renders one placeholder per image, which the server expands
(``vision.py``), and ``usage.prompt_tokens`` counts the expanded prompt.

Answers that are not streamed are written by msgspec (``json_answer.py``), not through FastAPI's
``jsonable_encoder``, which walks every log-prob entry in Python.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from areal_tasks.agent.tool_calls import parse_tool_calls
from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.disconnect import while_connected
from areal_tasks.inference.server.json_answer import JsonAnswer
from areal_tasks.inference.server.limits import (
    check_chat_template_kwargs,
    check_prompt_chars,
    check_request_size,
)
from areal_tasks.inference.server.openai_bodies import ChatCompletionRequest, CompletionRequest
from areal_tasks.inference.server.openai_images import chat_images, without_images
from areal_tasks.inference.server.openai_logprobs import alternatives, chat_logprobs, completion_logprobs
from areal_tasks.inference.server.openai_stream import OpenAIStream, SSEResponse, finish_of
from areal_tasks.inference.server.request import Sequence

logger = logging.getLogger(__name__)


def _usage(seqs: list[Sequence], prompts: list[list[int]]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prompts)
    completion = sum(len(s.output_ids) for s in seqs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _strings(value: Any) -> list[str]:
    """Every string inside ``value`` (nested dicts and lists), to measure a chat before rendering it."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if prompt and isinstance(prompt[0], str):
        return [tokenizer.encode(p) for p in prompt]
    if prompt and isinstance(prompt[0], list):
        return [list(p) for p in prompt]
    return [list(prompt)]


def render_chat(req: ChatCompletionRequest, tokenizer: Any) -> list[int]:
    """Token ids of the chat-template rendering of ``req``."""
    tools = None if req.tool_choice == "none" else req.tools
    try:
        text = tokenizer.apply_chat_template(
            req.messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
            continue_final_message=req.continue_final_message,
            **(req.chat_template_kwargs or {}),
        )
    except Exception as exc:  # jinja raise_exception / TemplateError: the caller's messages are wrong
        raise InferenceRequestError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
    return tokenizer.encode(text, add_special_tokens=False)


def _envelope(prefix: str, kind: str, server: Any) -> dict[str, Any]:
    """What every answer and every chunk of one answer starts with: ``id``, ``object``, ``created``, ``model``."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": server.served_model_name,
    }


def openai_router() -> APIRouter:
    """The router; it reaches the server through ``request.app.state.server``."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        server = request.app.state.server
        return {
            "object": "list",
            "data": [
                {
                    "id": server.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "areal",
                    "root": server.model_path,
                    "max_model_len": server.runner.max_len,
                }
            ],
        }

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        server = request.app.state.server
        req.check(server.limits)
        if req.stream:
            return await _completions_stream(req, server)
        return await while_connected(request, _completions(req, server))

    async def _completion_items(req: CompletionRequest, server: Any) -> tuple[list[list[int]], list[dict[str, Any]]]:
        texts = _strings(req.prompt)
        if texts:
            check_request_size(server.limits, [1] * len(texts))
            check_prompt_chars(server.limits, texts)
            prompts = await server.off_loop(_prompts, req.prompt, server.tokenizer, what="tokenizing the prompt")
        else:
            prompts = _prompts(req.prompt, server.tokenizer)
        params = req.sampling_params(req.max_tokens if req.max_tokens is not None else 16)
        items = [
            {
                "input_ids": p,
                "sampling_params": params,
                "rid": req.rid,
                "return_logprob": req.logprobs is not None,
                "logprob_start_len": -1,
                "top_logprobs_num": req.top_logprobs_num,
            }
            for p in prompts
        ]
        await server.prepare_images(items)
        return [item["input_ids"] for item in items], items

    async def _completions(req: CompletionRequest, server: Any) -> JsonAnswer:
        prompts, items = await _completion_items(req, server)
        seqs = await server.generate_sequences(items)
        choices = []
        for index, seq in enumerate(seqs):
            reason, matched = finish_of(seq)
            logprobs = None
            if req.logprobs is not None:
                logprobs, _ = completion_logprobs(
                    server.tokenizer, seq.output_ids, seq.output_logprobs, tops=alternatives(seq)
                )
            choices.append(
                {
                    "index": index,
                    "text": server.output_text(seq),
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        return JsonAnswer(
            {
                **_envelope("cmpl", "text_completion", server),
                "choices": choices,
                "usage": _usage(seqs, prompts),
                "metadata": {"weight_version": seqs[-1].finish_version},
            }
        )

    async def _completions_stream(req: CompletionRequest, server: Any) -> SSEResponse:
        prompts, items = await _completion_items(req, server)
        seqs, futures = server.submit_sequences(items)
        stream = OpenAIStream(
            tokenizer=server.tokenizer,
            seqs=seqs,
            futures=futures,
            final_text=server.output_text,
            chat=False,
            logprobs=req.logprobs is not None,
            include_usage=req.include_usage,
            prompt_tokens=sum(len(p) for p in prompts),
            envelope=_envelope("cmpl", "text_completion", server),
        )
        return SSEResponse(stream.events(), on_close=lambda: server.abort_abandoned(seqs))

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        server = request.app.state.server
        req.check(server.limits)
        if req.stream:
            return await _chat_stream(req, server)
        return await while_connected(request, _chat_completions(req, server))

    async def _chat_items(req: ChatCompletionRequest, server: Any) -> tuple[list[int], list[dict[str, Any]]]:
        check_chat_template_kwargs(server.limits, req.chat_template_kwargs)
        # the rendering holds every message and tool: longer text than the context holds cannot fit
        images = chat_images(req.messages)
        text = "".join(_strings([without_images(req.messages), req.tools or []]))
        check_prompt_chars(server.limits, [text], "chat")
        prompt = await server.off_loop(render_chat, req, server.tokenizer, what="rendering the chat")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        item = {
            "input_ids": prompt,
            "sampling_params": req.sampling_params(max_tokens),
            "rid": req.rid,
            "return_logprob": req.logprobs,
            "logprob_start_len": -1,
            "top_logprobs_num": req.top_logprobs_num,
            "image_data": images,
            "image_field": "image_url",
        }
        await server.prepare_images([item])
        return item["input_ids"], [item]

    async def _chat_completions(req: ChatCompletionRequest, server: Any) -> JsonAnswer:
        prompt, items = await _chat_items(req, server)
        seqs = await server.generate_sequences(items)
        choices = []
        for index, seq in enumerate(seqs):
            reason, matched = finish_of(seq)
            content, calls = server.output_text(seq), []
            if req.tools and server.tool_call_parser:
                content, calls = parse_tool_calls(content)
            message = {"role": "assistant", "content": content, "tool_calls": calls or None, "reasoning_content": None}
            logprobs = None
            if req.logprobs:
                logprobs = chat_logprobs(server.tokenizer, seq.output_ids, seq.output_logprobs, alternatives(seq))
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": "tool_calls" if calls else reason,
                    "matched_stop": matched,
                }
            )
        return JsonAnswer(
            {
                **_envelope("chatcmpl", "chat.completion", server),
                "choices": choices,
                "usage": _usage(seqs, [prompt]),
                "metadata": {"weight_version": seqs[-1].finish_version},
            }
        )

    async def _chat_stream(req: ChatCompletionRequest, server: Any) -> SSEResponse:
        prompt, items = await _chat_items(req, server)
        seqs, futures = server.submit_sequences(items)
        stream = OpenAIStream(
            tokenizer=server.tokenizer,
            seqs=seqs,
            futures=futures,
            final_text=server.output_text,
            chat=True,
            logprobs=req.logprobs,
            include_usage=req.include_usage,
            prompt_tokens=len(prompt),
            envelope=_envelope("chatcmpl", "chat.completion.chunk", server),
            parse_tools=parse_tool_calls if req.tools and server.tool_call_parser else None,
        )
        return SSEResponse(stream.events(), on_close=lambda: server.abort_abandoned(seqs))

    return router
