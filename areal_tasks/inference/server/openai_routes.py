"""OpenAI-compatible ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (non-streaming).

Chat requests are rendered with the tokenizer's chat template: ``messages``, ``tools`` (omitted when
``tool_choice`` is ``"none"``, as SGLang does), ``add_generation_prompt`` and the
``chat_template_kwargs`` the server allows (``limits.py``: booleans, integers or short strings
under allowed names; never a template of the caller's). Rendering and tokenising run on the
server's tokenize lane within its time limit, after the text was measured against the context.
Bodies are strict like the native ones (``protocol.py``): a value of the wrong type is a 400.
Sampling fields map onto SGLang's ``sampling_params`` (``max_tokens`` ->
``max_new_tokens``, ``seed`` -> ``sampling_seed``; SGLang's extensions ``top_k``, ``min_p``,
``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``, ``no_stop_trim`` are accepted too).
Every answer carries ``usage`` (prompt, completion, total tokens; for ``n > 1`` the prompt counts
once) and SGLang's ``metadata.weight_version``. With the server's ``tool_call_parser`` set to
``qwen25`` (Hermes/Qwen style ``<tool_call>{"name", "arguments"}</tool_call>`` blocks), tool calls
in the output are returned as ``message.tool_calls`` with finish reason ``tool_calls``.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StringConstraints

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.disconnect import while_connected
from areal_tasks.inference.server.limits import (
    MAX_TEMPLATE_STRING_CHARS,
    check_chat_template_kwargs,
    check_prompt_chars,
    check_request_size,
)
from areal_tasks.inference.server.request import Sequence

logger = logging.getLogger(__name__)

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_CALL_PARSERS = ("qwen25",)


#: the value of one allowed chat-template argument.
TemplateValue = bool | int | Annotated[str, StringConstraints(max_length=MAX_TEMPLATE_STRING_CHARS)]


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stream: bool = False
    rid: str | None = None

    def sampling_params(self, max_tokens: int | None) -> dict[str, Any]:
        if self.stream:
            raise InferenceRequestError("stream=true is not supported by the embedded server")
        params: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "n": self.n,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "sampling_seed": self.seed,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": self.no_stop_trim,
        }
        return {k: v for k, v in params.items() if v is not None}


class CompletionRequest(_OpenAIBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False


class ChatCompletionRequest(_OpenAIBody):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, TemplateValue] | None = None


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split Qwen/Hermes ``<tool_call>`` blocks off ``text``: (remaining content or None, tool calls).
    A block that is not a JSON object with a ``name`` stays in the content."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        return ""

    content = _TOOL_CALL.sub(take, text)
    if not calls:
        return text, []
    return content.strip() or None, calls


def _finish(seq: Sequence) -> tuple[str, Any]:
    reason = seq.finish_reason or {}
    return reason.get("type", "stop"), reason.get("matched")


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
        return await while_connected(request, _completions(req, request.app.state.server))

    async def _completions(req: CompletionRequest, server: Any) -> dict[str, Any]:
        if req.echo:
            raise InferenceRequestError("echo=true is not supported by the embedded server")
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
            }
            for p in prompts
        ]
        seqs = await server.generate_sequences(items)
        choices = []
        for index, seq in enumerate(seqs):
            reason, matched = _finish(seq)
            logprobs = None
            if req.logprobs is not None:
                tokens = [server.tokenizer.decode([t]) for t in seq.output_ids]
                logprobs = {
                    "tokens": tokens,
                    "token_logprobs": list(seq.output_logprobs),
                    "top_logprobs": [None] * len(tokens),
                    "text_offset": [],
                }
            choices.append(
                {
                    "index": index,
                    "text": server.output_text(seq),
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": server.served_model_name,
            "choices": choices,
            "usage": _usage(seqs, prompts),
            "metadata": {"weight_version": seqs[-1].finish_version},
        }

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        return await while_connected(request, _chat_completions(req, request.app.state.server))

    async def _chat_completions(req: ChatCompletionRequest, server: Any) -> dict[str, Any]:
        if req.top_logprobs:
            raise InferenceRequestError("top_logprobs > 0 is not supported by the embedded server")
        check_chat_template_kwargs(server.limits, req.chat_template_kwargs)
        # the rendering holds every message and tool: longer text than the context holds cannot fit
        check_prompt_chars(server.limits, ["".join(_strings([req.messages, req.tools or []]))], "chat")
        prompt = await server.off_loop(render_chat, req, server.tokenizer, what="rendering the chat")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = req.sampling_params(max_tokens)
        items = [
            {
                "input_ids": prompt,
                "sampling_params": params,
                "rid": req.rid,
                "return_logprob": req.logprobs,
                "logprob_start_len": -1,
            }
        ]
        seqs = await server.generate_sequences(items)
        choices = []
        for index, seq in enumerate(seqs):
            reason, matched = _finish(seq)
            content, calls = server.output_text(seq), []
            if req.tools and server.tool_call_parser:
                content, calls = parse_tool_calls(content)
            message = {"role": "assistant", "content": content, "tool_calls": calls or None, "reasoning_content": None}
            logprobs = None
            if req.logprobs:
                logprobs = {
                    "content": [
                        {
                            "token": (tok := server.tokenizer.decode([t])),
                            "logprob": lp,
                            "bytes": list(tok.encode()),
                            "top_logprobs": [],
                        }
                        for t, lp in zip(seq.output_ids, seq.output_logprobs)
                    ]
                }
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": "tool_calls" if calls else reason,
                    "matched_stop": matched,
                }
            )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": server.served_model_name,
            "choices": choices,
            "usage": _usage(seqs, [prompt]),
            "metadata": {"weight_version": seqs[-1].finish_version},
        }

    return router
