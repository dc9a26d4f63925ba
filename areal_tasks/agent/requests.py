"""The fields of an OpenAI request to ``ArealOpenAI``: which are honoured, ignored or refused, and the
:class:`~areal_tasks.api.inference.SamplingParams` they map to.

Omitted fields (absent, ``None``, or the SDK's ``NOT_GIVEN``/``omit`` sentinels, which agent
frameworks pass through) take the client's defaults (the job's ``rollout.sampling``). ``extra_body``
is merged into the fields, as the SDK merges it into the JSON body. Fields that only describe the
caller or the transport (``user``, ``metadata``, ``store``, ``service_tier``, ``extra_headers``,
``timeout``...) and unknown fields are ignored (logged at debug). Fields that would change what is
generated and cannot be honoured by the engine (``response_format`` other than text, ``logit_bias``,
penalties, legacy ``functions``, audio, ``top_logprobs`` > 0: the engine returns only the sampled
token's log-prob...) raise :class:`~areal_tasks.errors.AgentRequestError` naming the field.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from areal_tasks.api.inference import SamplingParams
from areal_tasks.errors import AgentRequestError, ConfigError

logger = logging.getLogger(__name__)

__all__ = ["check_unsupported", "present_fields", "sampling_params"]

#: fields each create() understands beyond the refused ones (the rest is ignored).
_USED = frozenset({"messages", "prompt", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls"})
_USED |= {"temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "n", "logprobs", "top_logprobs"}
_USED |= {"max_tokens", "max_completion_tokens", "max_output_tokens", "stream", "stream_options"}
_USED |= {"chat_template_kwargs", "previous_response_id"}


def _absent(value: Any) -> bool:
    from openai import NotGiven, Omit

    return value is None or isinstance(value, (NotGiven, Omit))


def present_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The fields actually given (``extra_body`` merged in; omitted/None/NOT_GIVEN dropped)."""
    fields = {k: v for k, v in kwargs.items() if k != "extra_body" and not _absent(v)}
    extra = kwargs.get("extra_body")
    if not _absent(extra):
        if not isinstance(extra, dict):
            raise AgentRequestError("extra_body must be an object", param="extra_body")
        fields.update({k: v for k, v in extra.items() if not _absent(v)})
    ignored = sorted(set(fields) - _USED)
    if ignored:
        logger.debug("ignoring request fields %s", ignored)
    return fields


def _refuse(param: str, why: str) -> AgentRequestError:
    return AgentRequestError(f"{param}: {why}", param=param)


def check_unsupported(fields: dict[str, Any]) -> None:
    """Raise AgentRequestError naming the first field that changes semantics and cannot be honoured."""
    fmt = fields.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _refuse("response_format", "only {'type': 'text'} is served (no constrained decoding)")
    if fields.get("logit_bias"):
        raise _refuse("logit_bias", "is not supported by the inference engine")
    for name in ("frequency_penalty", "presence_penalty"):
        if fields.get(name, 0) != 0:
            raise _refuse(name, "is not supported by the inference engine (only 0)")
    for name in ("functions", "function_call"):
        if name in fields:
            raise _refuse(name, "the legacy functions API is not served; use tools and tool_choice")
    for name in ("audio", "prediction", "web_search_options", "suffix", "background", "conversation", "prompt_id"):
        if name in fields:
            raise _refuse(name, "is not supported")
    if fields.get("modalities") not in (None, ["text"]):
        raise _refuse("modalities", "only ['text'] is served")
    if fields.get("echo"):
        raise _refuse("echo", "echo=true is not supported")
    if fields.get("best_of", 1) != 1:
        raise _refuse("best_of", "only 1 is supported; use n")
    top = fields.get("top_logprobs")
    if top is not None and top != 0:
        raise _refuse("top_logprobs", "must be 0: the engine returns only the sampled token's log-prob")
    n = fields.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _refuse("n", f"must be an int >= 1, got {n!r}")


def sampling_params(defaults: SamplingParams, fields: dict[str, Any], max_tokens_field: str) -> SamplingParams:
    """``defaults`` with the request's temperature, top_p, top_k, stop, seed and token budget.

    The budget is ``max_completion_tokens`` or ``max_tokens`` (chat), ``max_tokens`` (completions) or
    ``max_output_tokens`` (responses), as ``max_tokens_field`` names.
    """
    changes: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "seed"):
        if name in fields:
            changes[name] = fields[name]
    budget = fields.get("max_completion_tokens", fields.get(max_tokens_field))
    if budget is not None:
        changes["max_new_tokens"] = budget
    if "stop" in fields:
        stop = fields["stop"]
        changes["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    if "stop_token_ids" in fields:
        changes["stop_token_ids"] = tuple(fields["stop_token_ids"])
    try:
        return replace(defaults, **changes)
    except (ConfigError, TypeError) as exc:
        param = next((k for k in changes if k in str(exc)), None)
        if param == "max_new_tokens":
            param = "max_completion_tokens" if "max_completion_tokens" in fields else max_tokens_field
        raise AgentRequestError(f"invalid sampling field: {exc}", param=param) from exc
