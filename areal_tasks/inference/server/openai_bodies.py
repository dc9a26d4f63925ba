"""Request bodies of the OpenAI-compatible routes and the checks that refuse what cannot be served.

Bodies are strict like the native ones (``protocol.py``): a value of the wrong JSON type is a 400
naming the field (``logprobs: 3`` on chat, ``logprobs: true`` on completions). Sampling fields map
onto SGLang's ``sampling_params`` (``max_tokens`` -> ``max_new_tokens``, ``seed`` ->
``sampling_seed``; SGLang's extensions ``top_k``, ``min_p``, ``stop_token_ids``, ``ignore_eos``,
``skip_special_tokens``, ``no_stop_trim`` are accepted too).

:meth:`_OpenAIBody.check` refuses, with a 400 in OpenAI's error shape whose ``param`` names the
field: ``n`` below 1 or above the server's ``max_n``; ``stream_options`` without ``stream``;
``top_logprobs`` outside 0..20, or set without ``logprobs: true`` (chat), or sent to
``/v1/completions`` (which takes ``logprobs: <int>``); ``logprobs`` outside 0..5 (completions);
``echo``; and any field that would change what is generated but is not implemented, unless it is at
its no-op value (:data:`UNSERVED`: penalties, ``logit_bias``, ``response_format`` other than text,
constrained decoding, ``best_of`` above ``n``, ``suffix``, the legacy functions API...): such a field
is refused, never ignored, as ``sampling.py`` refuses SGLang's. Other unknown fields (``user``,
``metadata``, ``store``...) are ignored. Alternatives to the sampled token (chat ``top_logprobs`` 1..20, completions'
``logprobs`` 1..5) are served: :meth:`ChatCompletionRequest.top_logprobs_num` and
:meth:`CompletionRequest.top_logprobs_num` are how many each generated position carries
(``top_logprobs.py`` computes them; ``openai_logprobs.py`` shapes them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.limits import MAX_TEMPLATE_STRING_CHARS, MAX_TOP_LOGPROBS, ServerLimits

logger = logging.getLogger(__name__)

#: OpenAI's bounds: chat ``top_logprobs`` 0..20 (:data:`MAX_TOP_LOGPROBS`), completions ``logprobs`` 0..5.
MAX_COMPLETION_LOGPROBS = 5

#: the value of one allowed chat-template argument.
TemplateValue = bool | int | Annotated[str, StringConstraints(max_length=MAX_TEMPLATE_STRING_CHARS)]


def _refuse(param: str, message: str) -> InferenceRequestError:
    return InferenceRequestError(f"{param}: {message}", param=param)


def _absent(value: Any) -> bool:
    return value is None


def _falsy(value: Any) -> bool:
    return value is None or value in ("", {}, [])


#: vLLM's and SGLang's fields for constrained decoding.
_CONSTRAINED = ("regex", "ebnf", "json_schema", "structural_tag", "structured_outputs")
_CONSTRAINED += ("guided_json", "guided_regex", "guided_choice", "guided_grammar")

#: fields (OpenAI's, and vLLM's and SGLang's extensions of its routes) that would change what is
#: generated and that this server does not implement: name -> (whether a value is a no-op, why not).
UNSERVED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "frequency_penalty": (lambda v: v is None or v == 0, "penalties are not implemented; only 0 is served"),
    "presence_penalty": (lambda v: v is None or v == 0, "penalties are not implemented; only 0 is served"),
    "repetition_penalty": (lambda v: v is None or v == 1, "penalties are not implemented; only 1 is served"),
    "logit_bias": (_falsy, "is not supported by the embedded server"),
    "response_format": (
        lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
        "only {'type': 'text'} is served (no constrained decoding)",
    ),
    "min_tokens": (lambda v: v is None or v == 0, "is not supported by the embedded server; only 0"),
    "suffix": (_falsy, "is not supported by the embedded server"),
    "functions": (_absent, "the legacy functions API is not served; use tools and tool_choice"),
    "function_call": (_absent, "the legacy functions API is not served; use tools and tool_choice"),
    "modalities": (lambda v: v is None or v == ["text"], "only ['text'] is served"),
    "audio": (_absent, "is not supported by the embedded server"),
    "prediction": (_absent, "is not supported by the embedded server"),
    **dict.fromkeys(_CONSTRAINED, (_absent, "constrained decoding is not supported by the embedded server")),
}


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices."""

    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class _OpenAIBody(BaseModel):
    # unknown fields are kept (``model_extra``) so that check() can refuse the UNSERVED ones by name
    model_config = ConfigDict(extra="allow", strict=True)

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
    stream_options: StreamOptions | None = None
    rid: str | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check(self, limits: ServerLimits) -> None:
        """Refuse the fields common to both routes that cannot be served (see the module doc)."""
        if self.n < 1:
            raise _refuse("n", f"must be at least 1, got {self.n}")
        if self.n > limits.max_n:
            raise _refuse("n", f"this server generates at most n={limits.max_n} samples per prompt, got {self.n}")
        if self.stream_options is not None and not self.stream:
            raise _refuse("stream_options", "is only allowed when stream is true")
        extra = self.model_extra or {}
        for name, (no_op, why) in UNSERVED.items():
            if name in extra and not no_op(extra[name]):
                raise _refuse(name, why)
        best_of = extra.get("best_of")
        if best_of is not None and best_of not in (1, self.n):
            raise _refuse("best_of", f"only best_of equal to n ({self.n}) is served (no ranking of samples); use n")

    def sampling_params(self, max_tokens: int | None) -> dict[str, Any]:
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
    #: not a field of this route (chat's); kept to refuse it by name rather than ignore it.
    top_logprobs: Any = None

    def check(self, limits: ServerLimits) -> None:
        super().check(limits)
        if self.top_logprobs is not None:
            raise _refuse("top_logprobs", "is a chat completions field; /v1/completions takes logprobs: <int>")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise _refuse("logprobs", f"must be in 0..{MAX_COMPLETION_LOGPROBS}, got {self.logprobs}")
        if self.echo:
            raise _refuse("echo", "echo=true is not supported by the embedded server")

    @property
    def top_logprobs_num(self) -> int:
        """The alternatives each generated position carries (``logprobs: k``; 0 without logprobs)."""
        return self.logprobs or 0


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

    def check(self, limits: ServerLimits) -> None:
        super().check(limits)
        top = self.top_logprobs
        if top is not None:
            if not 0 <= top <= MAX_TOP_LOGPROBS:
                raise _refuse("top_logprobs", f"must be in 0..{MAX_TOP_LOGPROBS}, got {top}")
            if not self.logprobs:
                raise _refuse("top_logprobs", "requires logprobs: true")

    @property
    def top_logprobs_num(self) -> int:
        """The alternatives each generated position carries (``top_logprobs``, with ``logprobs: true``)."""
        return (self.top_logprobs or 0) if self.logprobs else 0
