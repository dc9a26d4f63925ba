"""The state of one generated sequence inside the engine, and SGLang's finish rules.

A ``/generate`` request with ``n`` samples becomes ``n`` :class:`Sequence` objects sharing one
:class:`SequenceGroup`, so that the prompt is prefilled once and its KV copied to the siblings
(separate requests with one prompt share it through the prefix cache, ``prefix_cache.py``).

Finish rules follow SGLang's ``Req.update_finish_state`` order: a stop string (checked on the
decoded tail of the output), then a stop token or EOS (unless ``ignore_eos``; explicit
``stop_token_ids`` apply even then), then the length budget. Finish reasons are SGLang's JSON:
``{"type": "stop", "matched": <token id | string>}``, ``{"type": "length", "length": n}`` and
``{"type": "abort", "message": ..., "status_code": null, "err_type": null}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.sampling import SamplingParams
from areal_tasks.inference.server.top_logprobs import TopEntry
from areal_tasks.inference.server.vision import VisionPrompt

logger = logging.getLogger(__name__)

FinishReason = dict[str, Any]


def finish_matched(matched: int | str) -> FinishReason:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> FinishReason:
    return {"type": "length", "length": length}


def finish_abort(message: str, status_code: int | None = None) -> FinishReason:
    """An abort; a ``status_code`` marks a failure the HTTP layer answers with that status."""
    err_type = None if status_code is None else ("BadRequestError" if status_code < 500 else "InternalServerError")
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


@dataclass
class SequenceGroup:
    """What the ``n`` samples of one request share: the prompt's prefill."""

    prompt_ids: list[int]
    #: the prompt's images, ready for a vision-language model (``vision.py``); None for text.
    vision: VisionPrompt | None = None
    #: slot of a live member whose first ``len(prompt_ids)`` cached positions are the prompt.
    source_slot: int | None = None
    #: the logits after the last prompt token ([V], float32) under the current weights.
    prompt_logits: torch.Tensor | None = None
    #: logprobs of prompt tokens from ``logprob_start_len`` on (first position: None).
    input_logprobs: list[float | None] = field(default_factory=list)
    #: with ``top_logprobs_num``: the alternatives at those positions, like ``input_logprobs``.
    input_top_logprobs: list[TopEntry | None] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class Sequence:
    """One sequence being generated (see the module doc). Equal only to itself (hashable by
    identity): the engine compares its batches row by row, and two requests may share every field
    but their slot."""

    rid: str
    group: SequenceGroup
    params: SamplingParams
    #: called once from the engine thread when the sequence finishes (any reason).
    on_finish: Callable[[Sequence], None]
    return_logprob: bool = False
    #: -1: no prompt logprobs; k >= 0: logprobs of prompt tokens k.. (SGLang's logprob_start_len).
    logprob_start_len: int = -1
    #: alternatives wanted at each output position (0: none; ``top_logprobs.py``).
    top_logprobs_num: int = 0
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    #: with ``top_logprobs_num`` > 0: each output token's alternatives, aligned with ``output_ids``.
    output_top_logprobs: list[TopEntry] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    slot: int | None = None
    #: tokens sampled on the device but not yet read back (an overlapped decode step in flight).
    pending_tokens: int = 0
    #: this sequence's row in the last decode step launched (where its unread token is).
    step_row: int = -1
    #: True after a ``retract`` pause: the next prefill runs prompt + output.
    retracted: bool = False
    #: what :meth:`FinishChecker.prepare` precomputes so a decode step checks a finish rule only
    #: when one can apply: the tokens that stop it, the output length that ends it, and whether
    #: stop strings need a look at every token. The defaults send every token to the full check.
    stop_ids: frozenset[int] = frozenset()
    length_cap: int = 0
    watch_text: bool = True
    num_retractions: int = 0
    #: prompt positions whose KV came from cached KV instead of a prefill (SGLang's ``cached_tokens``).
    cached_tokens: int = 0
    #: (old weight version, output tokens generated under it) at each weight change during the run.
    version_events: list[tuple[str, int]] = field(default_factory=list)
    #: the weight version when the sequence finished (what its answer reports).
    finish_version: str | None = None
    created_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.group.prompt_ids

    @property
    def rope_delta(self) -> int:
        """What a decode step adds to this sequence's rotary position (its images' ``rope_delta``; 0
        for text)."""
        vision = self.group.vision
        return 0 if vision is None else vision.rope_delta

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token: int, logprob: float) -> None:
        self.output_ids.append(token)
        self.output_logprobs.append(logprob)
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()


def check_prompt(seq: Sequence, context_length: int, vocab_size: int) -> None:
    """Refuse an empty prompt, one that leaves no room in the context, or ids outside the vocabulary."""
    prompt = seq.prompt_ids
    if not prompt:
        raise InferenceRequestError(f"request {seq.rid}: the prompt is empty")
    if len(prompt) >= context_length:
        raise InferenceRequestError(
            f"request {seq.rid}: the prompt has {len(prompt)} tokens, the context length is {context_length}"
        )
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise InferenceRequestError(f"request {seq.rid}: token ids {bad[:5]} are outside the vocabulary")


class FinishChecker:
    """Decides after every new token whether a sequence is done (SGLang's rules, see the module doc)."""

    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int], context_length: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length
        self._stop_len_cache: dict[tuple[str, ...], int] = {}

    def _stop_window(self, stops: tuple[str, ...]) -> int:
        if stops not in self._stop_len_cache:
            lengths = [len(self.tokenizer.encode(s, add_special_tokens=False)) for s in stops]
            self._stop_len_cache[stops] = max(lengths, default=0)
        return self._stop_len_cache[stops]

    def prepare(self, seq: Sequence) -> None:
        """Precompute ``seq``'s finish triggers (see :class:`Sequence`); :meth:`check` still
        decides, and only needs calling for a token in ``stop_ids``, at ``length_cap``, or with
        stop strings."""
        params = seq.params
        seq.stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        seq.length_cap = min(params.max_new_tokens, self.context_length - len(seq.prompt_ids))
        seq.watch_text = bool(params.stop)

    def check(self, seq: Sequence) -> FinishReason | None:
        """The finish reason for ``seq`` after its last token, or None to continue."""
        params = seq.params
        if params.stop:
            window = self._stop_window(params.stop) + 1
            tail = self.tokenizer.decode(seq.output_ids[-window:])
            for stop in params.stop:
                if stop in tail:
                    return finish_matched(stop)
        last = seq.output_ids[-1]
        if last in params.stop_token_ids or (not params.ignore_eos and last in self.eos_token_ids):
            return finish_matched(last)
        if len(seq.output_ids) >= params.max_new_tokens:
            return finish_length(params.max_new_tokens)
        if len(seq.prompt_ids) + len(seq.output_ids) >= self.context_length:
            return finish_length(len(seq.output_ids))
        return None
