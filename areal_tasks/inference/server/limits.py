"""What one client may ask of the embedded server, the ``areal serve`` flags that set it, and the checks.

Without limits one request could queue any number of sequences (``n``, prompts per request), send
any body, make the server tokenise any text and render caller-chosen template arguments, and so
hold up every other client. :class:`ServerLimits` bounds each of these:

* ``max_n`` samples per prompt and ``max_prompts_per_request`` prompts per request: past them a
  request is refused with 413, before anything is queued;
* ``max_queued_sequences``: sequences running, waiting or held by a weight update, together. The
  engine refuses a request that would pass it with **429 and a ``Retry-After``** (the queue
  drains; try again), and with 413 one that could never fit. Default: ``QUEUE_PER_SLOT`` times
  ``--max-running-requests``, so a full queue still turns over in a few batches' time;
* ``max_body_bytes``: a larger body is refused with 413 as it arrives (``body_limit.py``).
  Default: 8 MiB, or ``BODY_BYTES_PER_TOKEN`` per context token when that is more, so a prompt of
  token ids that fits in the context always fits in a body;
* ``max_prompt_chars``: text longer than this cannot fit in the context, so it is refused with
  413 before it is tokenised. Default: context length x the tokenizer's longest token x
  ``NORMALISATION_SLACK`` (normalisation such as NFC may merge up to three characters into one;
  the slack covers it);
* ``max_stop_strings`` / ``max_stop_chars``: every decode step of a sequence with stop strings
  decodes a tail as long as its longest one, so their number and length are bounded (400);
* ``tokenize_timeout_s``: tokenising, chat-template rendering and image decoding run on the
  server's ``tokenize`` thread lane (``executors.py``) for at most this long (413 past it), after
  waiting at most this long for a thread (429 with ``Retry-After`` past that: time queued behind
  other requests never counts against a request's own work);
* ``chat_template_kwargs``: the only keys a chat request may pass to the server's chat template
  (values: booleans, integers or short strings). A caller can never supply the template itself.

RL never meets these limits: the job launcher sizes ``max_queued_sequences`` and ``max_n`` from
the rollout config (``inference/launch/commands.py::embedded_command``), and the client waits out
a 429 for its ``Retry-After`` without spending a retry (``inference/client/core.py``).

Torch-free and FastAPI-free: ``areal serve --help`` imports it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

from areal_tasks.errors import ConfigError, InferenceLimitError, InferenceRequestError

logger = logging.getLogger(__name__)

__all__ = [
    "BODY_BYTES_PER_TOKEN",
    "DEFAULT_CHAT_TEMPLATE_KWARGS",
    "MIN_BODY_BYTES",
    "NORMALISATION_SLACK",
    "QUEUE_PER_SLOT",
    "ServerLimits",
    "add_limit_arguments",
    "check_chat_template_kwargs",
    "check_prompt_chars",
    "check_request_size",
    "check_stops",
    "limits_from_args",
]

#: the default queue bound is this many sequences per KV slot (``--max-running-requests``).
QUEUE_PER_SLOT = 8
#: the smallest default body limit, and the bytes per context token that raise it: a token id
#: takes at most 8 bytes of JSON (``151645, ``), so twice that leaves room for everything else.
MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN = 8 * 1024 * 1024, 16
#: characters of text one token may stand for, beyond the longest token: normalisation (NFC) can
#: merge up to three characters into one, so a margin of 4 never refuses text that would fit.
NORMALISATION_SLACK = 4
#: the chat-template arguments callers may set (the switches of reasoning templates).
DEFAULT_CHAT_TEMPLATE_KWARGS: tuple[str, ...] = ("enable_thinking", "thinking", "reasoning_effort")
#: a chat-template string argument longer than this is refused.
MAX_TEMPLATE_STRING_CHARS = 256
#: the most alternatives one position may carry (``top_logprobs.py``): OpenAI's chat bound, also
#: ``/generate``'s ``top_logprobs_num`` (SGLang sets none; the answer grows with it).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ServerLimits:
    """The bounds of one server (see the module doc); ``None`` = derived from the model at start."""

    max_n: int = 64
    max_prompts_per_request: int = 256
    #: None = ``QUEUE_PER_SLOT * max_running_requests``.
    max_queued_sequences: int | None = None
    #: None = ``max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * context length)``.
    max_body_bytes: int | None = None
    #: None = context length x longest token x ``NORMALISATION_SLACK``.
    max_prompt_chars: int | None = None
    max_stop_strings: int = 32
    max_stop_chars: int = 512
    tokenize_timeout_s: float = 5.0
    chat_template_kwargs: tuple[str, ...] = DEFAULT_CHAT_TEMPLATE_KWARGS

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "chat_template_kwargs":
                if isinstance(value, str) or not all(isinstance(k, str) and k for k in value):
                    problems.append(f"chat_template_kwargs must be a tuple of names, got {value!r}")
                continue
            if value is None and f.name in ("max_queued_sequences", "max_body_bytes", "max_prompt_chars"):
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or value <= 0 or (f.name != "tokenize_timeout_s" and not isinstance(value, int)):
                kind = "a positive number" if f.name == "tokenize_timeout_s" else "a positive integer"
                problems.append(f"{f.name} must be {kind}, got {value!r}")
        if problems:
            raise ConfigError("server limits: " + "; ".join(problems))

    def resolve(self, *, max_running_requests: int, context_length: int, longest_token_chars: int) -> ServerLimits:
        """These limits with the derived ones filled in for a model (see the field docs)."""
        queued = self.max_queued_sequences or QUEUE_PER_SLOT * max_running_requests
        body = self.max_body_bytes or max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * context_length)
        chars = self.max_prompt_chars or context_length * max(1, longest_token_chars) * NORMALISATION_SLACK
        return replace(self, max_queued_sequences=queued, max_body_bytes=body, max_prompt_chars=chars)


def check_request_size(limits: ServerLimits, samples_per_prompt: Sequence[int]) -> None:
    """Refuse (413) a request whose prompts or samples pass the limits, or that could never be
    queued whole; ``samples_per_prompt`` holds each prompt's ``n``."""
    prompts = len(samples_per_prompt)
    if prompts > limits.max_prompts_per_request:
        raise InferenceLimitError(
            f"the request has {prompts} prompts; this server takes at most {limits.max_prompts_per_request} per request"
        )
    largest = max(samples_per_prompt, default=1)
    if largest > limits.max_n:
        raise InferenceLimitError(f"n={largest}; this server generates at most n={limits.max_n} samples per prompt")
    total = sum(samples_per_prompt)
    if limits.max_queued_sequences is not None and total > limits.max_queued_sequences:
        raise InferenceLimitError(
            f"the request asks for {total} sequences; this server queues at most {limits.max_queued_sequences}"
        )


def check_prompt_chars(limits: ServerLimits, texts: Iterable[str], what: str = "prompt") -> None:
    """Refuse (413) text too long to fit in the context, before it is tokenised."""
    cap = limits.max_prompt_chars
    if cap is None:
        return
    for text in texts:
        if len(text) > cap:
            raise InferenceLimitError(
                f"the {what} has {len(text)} characters; at most {cap} can fit in this server's context"
            )


def check_stops(limits: ServerLimits, stops: Sequence[str]) -> None:
    """Refuse (400) more or longer stop strings than the limits allow."""
    if len(stops) > limits.max_stop_strings:
        raise InferenceRequestError(
            f"sampling_params.stop: {len(stops)} stop strings; this server takes at most {limits.max_stop_strings}"
        )
    longest = max((len(s) for s in stops), default=0)
    if longest > limits.max_stop_chars:
        raise InferenceRequestError(
            f"sampling_params.stop: a stop string of {longest} characters; at most {limits.max_stop_chars}"
        )


def check_chat_template_kwargs(limits: ServerLimits, kwargs: dict[str, object] | None) -> None:
    """Refuse (400) chat-template arguments outside the allow-list (the request body's types already
    restrict the values to booleans, integers and short strings)."""
    refused = sorted(set(kwargs or {}) - set(limits.chat_template_kwargs))
    if refused:
        allowed = ", ".join(limits.chat_template_kwargs) or "none"
        raise InferenceRequestError(
            f"chat_template_kwargs: {refused} are not accepted by this server (allowed: {allowed}); "
            "the chat template is the server's own"
        )


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``areal serve`` flags of :class:`ServerLimits`."""
    d = ServerLimits()
    group = parser.add_argument_group("request limits (413/429 past them)")
    group.add_argument(
        "--max-n", type=int, default=d.max_n, metavar="N", help=f"samples per prompt (default {d.max_n})"
    )
    group.add_argument(
        "--max-prompts-per-request",
        type=int,
        default=d.max_prompts_per_request,
        metavar="N",
        help=f"prompts in one request (default {d.max_prompts_per_request})",
    )
    group.add_argument(
        "--max-queued-sequences",
        type=int,
        default=None,
        metavar="N",
        help=f"sequences running and waiting together; past it: 429 with Retry-After "
        f"(default {QUEUE_PER_SLOT} x --max-running-requests)",
    )
    group.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        metavar="B",
        help=f"request body size (default {MIN_BODY_BYTES}, or {BODY_BYTES_PER_TOKEN} per context token if more)",
    )
    group.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        metavar="C",
        help="prompt text refused before tokenising (default: what could fit in the context)",
    )
    group.add_argument(
        "--max-stop-strings", type=int, default=d.max_stop_strings, metavar="N", help="stop strings per request"
    )
    group.add_argument(
        "--max-stop-chars", type=int, default=d.max_stop_chars, metavar="C", help="characters of one stop string"
    )
    group.add_argument(
        "--tokenize-timeout",
        type=float,
        default=d.tokenize_timeout_s,
        metavar="S",
        help=f"seconds one request's tokenising or chat-template rendering may take (default {d.tokenize_timeout_s:g})",
    )
    group.add_argument(
        "--chat-template-kwargs-allow",
        default=",".join(d.chat_template_kwargs),
        metavar="K1,K2",
        help=f"chat_template_kwargs keys callers may set (default {','.join(d.chat_template_kwargs)}; '' = none)",
    )


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The :class:`ServerLimits` of parsed ``areal serve`` flags (ConfigError when one is not positive)."""
    allow = tuple(k.strip() for k in args.chat_template_kwargs_allow.split(",") if k.strip())
    return ServerLimits(
        max_n=args.max_n,
        max_prompts_per_request=args.max_prompts_per_request,
        max_queued_sequences=args.max_queued_sequences,
        max_body_bytes=args.max_body_bytes,
        max_prompt_chars=args.max_prompt_chars,
        max_stop_strings=args.max_stop_strings,
        max_stop_chars=args.max_stop_chars,
        tokenize_timeout_s=args.tokenize_timeout,
        chat_template_kwargs=allow,
    )
