"""Sampling parameters of one request and the batched sampler that turns logits into tokens.

:class:`SamplingParams` mirrors SGLang's ``sampling_params`` (``sglang/srt/sampling/sampling_params.py``):
the same names, defaults and checks for the parameters this server implements (max_new_tokens,
stop, stop_token_ids, temperature, top_p, top_k, min_p, ignore_eos, n, sampling_seed,
skip_special_tokens, no_stop_trim...). A parameter SGLang knows but this server cannot honour
(penalties, grammars, logit_bias...) is refused when set to a non-default value, never ignored.
Values are taken as JSON gives them, never converted: a number where a number belongs (an integer
is a number; a boolean is not), an integer where an integer belongs, a string or a list of strings
for ``stop``; anything else is refused with a message naming the parameter.

:func:`sample` handles a whole batch at once: greedy rows take the argmax; the other rows are
scaled by their temperature, filtered by top-k, top-p and min-p with SGLang's rules (top-p on the
mass of the unfiltered probabilities above a token) without sorting the vocabulary (a search
for each row's threshold, ``sampling_kernels.py``; an uncompiled picker on a GPU still sorts,
which is faster there eagerly: ``greedy.py``), and drawn by inverse CDF with one uniform
number per row, from the row's own ``torch.Generator`` when the request carries a seed, without
reading anything back from the device. The returned logprob of a
sampled token is SGLang's: ``log_softmax`` of the logits divided by the temperature (the raw logits
for greedy rows), before any filtering. The rows that ask for the most likely alternatives get them
from that same distribution (``top_logprobs.py``; :attr:`SamplingBatch.top` names those rows).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.greedy import GreedyPicker, greedy_pick
from areal_tasks.inference.server.sampling_kernels import draw_rows
from areal_tasks.inference.server.top_logprobs import TopRows
from areal_tasks.inference.server.transfer import host_to_device

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-6

#: SGLang parameters this server accepts and honours, with SGLang's defaults.
_SUPPORTED_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "stop": None,
    "stop_token_ids": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "n": 1,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "sampling_seed": None,
    "stream_interval": None,
}
#: SGLang's "whole vocabulary" top_k (its schema default) besides -1.
TOP_K_ALL = 1 << 30


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A float, or an integer a float can hold (``float()`` of a larger one would raise)."""
    return isinstance(value, float) or (_is_int(value) and abs(value) < 2**1000)


#: the JSON type of every supported parameter (None always means "the default"): what it must be, and the test.
_WIRE_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "max_new_tokens": ("an integer", _is_int),
    "stop": (
        "a string or a list of strings",
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
    ),
    # null entries are skipped, as before (SGLang keeps them in its set, where they match nothing)
    "stop_token_ids": (
        "a list of integers",
        lambda v: isinstance(v, list) and all(t is None or _is_int(t) for t in v),
    ),
    "temperature": ("a number", _is_number),
    "top_p": ("a number", _is_number),
    "top_k": ("an integer", _is_int),
    "min_p": ("a number", _is_number),
    "n": ("an integer", _is_int),
    "ignore_eos": ("a boolean", lambda v: isinstance(v, bool)),
    "skip_special_tokens": ("a boolean", lambda v: isinstance(v, bool)),
    "spaces_between_special_tokens": ("a boolean", lambda v: isinstance(v, bool)),
    "no_stop_trim": ("a boolean", lambda v: isinstance(v, bool)),
    "sampling_seed": ("an integer", _is_int),
    "stream_interval": ("an integer", _is_int),
}


def _shown(value: Any) -> str:
    """A short repr of a refused value (a body may be large; the message stays small)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: SGLang parameters this server does not implement: accepted only at their default value.
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "beam_width": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": {},
    "custom_params": None,
    "watermark": None,
    "choice": [],
}


#: distinct ``sampling_params`` wire forms :meth:`SamplingParams.from_dict` remembers (then it starts over).
PARSED_MEMO_SIZE = 256

_PARSED: dict[tuple[Any, ...], SamplingParams] = {}


def _wire_key(raw: Any) -> tuple[Any, ...] | None:
    """``raw``'s settings as a hashable key that tells apart what parsing tells apart: each value
    with its type (``1``, ``1.0`` and ``true`` are equal in Python, not on the wire), a list as a
    tuple of typed elements, in the order sent. None (no memo) for anything else: not an object, a
    nested list or an object as a value."""
    if type(raw) is not dict:
        return None
    key = []
    for name, value in raw.items():
        kind = type(value)
        key.append((name, kind, tuple((type(item), item) for item in value) if kind is list else value))
    frozen = tuple(key)
    try:
        hash(frozen)
    except TypeError:
        return None
    return frozen


@dataclass(frozen=True)
class SamplingParams:
    """The sampling parameters of one request (SGLang's names and defaults)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 = the whole vocabulary.
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False

    @property
    def greedy(self) -> bool:
        """SGLang treats temperature 0 (and top_k 1) as greedy decoding."""
        return self.temperature < _SAMPLING_EPS or self.top_k == 1

    @property
    def needs_filter(self) -> bool:
        """Whether top-k, top-p or min-p remove part of the vocabulary."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> SamplingParams:
        """Parse and validate SGLang ``sampling_params``; raises :class:`InferenceRequestError`.

        Settings parsed before are returned from a memo keyed by their wire form, types included
        (:func:`_wire_key`): an RL run sends the same settings with every call, and parsing them
        took about a tenth of the event loop's time a ``/generate`` call (the instances are frozen,
        so requests may share one)."""
        key = _wire_key(raw)
        if key is not None and (known := _PARSED.get(key)) is not None:
            return known
        params = cls._parse(raw)
        if key is not None:
            if len(_PARSED) >= PARSED_MEMO_SIZE:
                _PARSED.clear()
            _PARSED[key] = params
        return params

    @classmethod
    def _parse(cls, raw: dict[str, Any] | None) -> SamplingParams:
        if raw is not None and not isinstance(raw, dict):
            raise InferenceRequestError(f"sampling_params must be an object, got {_shown(raw)}")
        raw = dict(raw or {})
        unknown = sorted(set(raw) - set(_SUPPORTED_DEFAULTS) - set(_UNSUPPORTED_DEFAULTS))
        if unknown:
            raise InferenceRequestError(f"sampling_params: unknown fields {unknown}")
        refused = sorted(
            k for k, default in _UNSUPPORTED_DEFAULTS.items() if raw.get(k) is not None and raw.get(k) != default
        )
        if refused:
            raise InferenceRequestError(f"sampling_params: {refused} are not supported by the embedded server")
        wrong = [
            f"{k} must be {kind}, got {_shown(raw[k])}"
            for k, (kind, ok) in _WIRE_TYPES.items()
            if raw.get(k) is not None and not ok(raw[k])
        ]
        if wrong:
            raise InferenceRequestError("sampling_params: " + "; ".join(wrong))
        values = {k: (raw[k] if raw.get(k) is not None else d) for k, d in _SUPPORTED_DEFAULTS.items()}
        stop = values["stop"] or ()
        params = cls(
            max_new_tokens=values["max_new_tokens"],
            temperature=float(values["temperature"]),
            top_p=float(values["top_p"]),
            top_k=-1 if values["top_k"] >= TOP_K_ALL else values["top_k"],
            min_p=float(values["min_p"]),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            stop_token_ids=frozenset(t for t in values["stop_token_ids"] or () if t is not None),
            ignore_eos=values["ignore_eos"],
            n=values["n"],
            sampling_seed=values["sampling_seed"],
            skip_special_tokens=values["skip_special_tokens"],
            spaces_between_special_tokens=values["spaces_between_special_tokens"],
            no_stop_trim=values["no_stop_trim"],
        )
        params.validate()
        return params

    def validate(self) -> None:
        """SGLang's ``verify`` checks for the implemented parameters."""
        problems = []
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 0:
            problems.append(f"max_new_tokens must be an integer >= 0, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            problems.append(f"temperature must be a non-negative finite number, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1 and self.top_k != -1:
            problems.append(f"top_k must be -1 (disable) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            problems.append(f"min_p must be in [0, 1], got {self.min_p}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            problems.append(f"n must be an integer >= 1, got {self.n!r}")
        seed = self.sampling_seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63):
            problems.append(f"sampling_seed must be a 64-bit integer, got {seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            problems.append(f"stop must be a string or a list of non-empty strings, got {list(self.stop)!r}")
        if problems:
            raise InferenceRequestError("sampling_params: " + "; ".join(problems))


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator for a seeded request (None: the request draws from the shared stream)."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed % (2**64))
    return gen


@dataclass
class SamplingBatch:
    """Per-row sampling settings of one batch, as tensors on the logits' device."""

    temperatures: torch.Tensor
    top_ps: torch.Tensor
    top_ks: torch.Tensor
    min_ps: torch.Tensor
    greedy: torch.Tensor
    generators: list[torch.Generator | None]
    all_greedy: bool
    any_filter: bool
    #: whether a sampled row filters by top-k / by top-p (the Triton kernel leaves out what none needs).
    any_top_k: bool = True
    any_top_p: bool = True
    #: the rows that want their tokens' most likely alternatives (None: no row does).
    top: TopRows | None = None
    #: (row, generator) of the seeded rows, found once a table (a sampled step draws for these alone
    #: from their own generators, not looking at every row).
    seeded: list[tuple[int, torch.Generator]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        device: torch.device,
        top_logprobs: list[int] | None = None,
    ) -> SamplingBatch:
        """Per-row tensors (one host-to-device copy that does not wait for the device; none at all
        for an all-greedy batch; one more where ``top_logprobs``, alternatives wanted per row, has
        a row above 0)."""
        all_greedy = all(p.greedy for p in params)
        rows = len(params)
        if all_greedy:
            table = torch.ones(5, rows, device=device)
        else:
            table = host_to_device(
                [
                    [1.0 if p.greedy else p.temperature for p in params],
                    [p.top_p for p in params],
                    [float(p.top_k if p.top_k > 0 else TOP_K_ALL) for p in params],
                    [p.min_p for p in params],
                    [float(p.greedy) for p in params],
                ],
                torch.float64,
                device,
            )
        return cls(
            temperatures=table[0].float(),
            top_ps=table[1].float(),
            top_ks=table[2].long(),
            min_ps=table[3].float(),
            greedy=table[4].bool(),
            generators=generators,
            all_greedy=all_greedy,
            any_filter=any(p.needs_filter and not p.greedy for p in params),
            any_top_k=any(p.top_k > 0 and not p.greedy for p in params),
            any_top_p=any(p.top_p < 1.0 and not p.greedy for p in params),
            top=TopRows.build(top_logprobs, device) if top_logprobs else None,
            seeded=[(row, gen) for row, gen in enumerate(generators) if gen is not None],
        )


def _uniforms(batch: SamplingBatch, rows: int, device: torch.device) -> torch.Tensor:
    """One U[0, 1) number per row: from the row's generator if seeded, else the shared stream."""
    u = torch.rand(rows, device=device)
    for row, gen in batch.seeded:
        u[row] = torch.rand(1, generator=gen, device=gen.device).to(device)[0]
    return u


def _seeds(batch: SamplingBatch, rows: int, device: torch.device) -> torch.Tensor:
    """One Philox key per row (int64, for ``sampling_triton.py``): from the row's generator if
    seeded, else the shared stream."""
    seeds = torch.randint(0, 2**62, (rows,), device=device)
    for row, gen in batch.seeded:
        seeds[row] = torch.randint(0, 2**62, (1,), generator=gen, device=gen.device).to(device)[0]
    return seeds


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    greedy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = greedy_pick,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V]; returns (token ids [B] int64, logprobs [B] float32).

    Nothing here waits for the device (no read-back of sizes or values), so the overlapped engine
    can queue a step's sampling behind its forward and go on. Every row of a mixed batch is drawn
    and greedy rows then take their argmax (their temperature is 1 in the batch, so their logprob
    is that of the raw logits, as SGLang reports it). An all-greedy batch goes to ``greedy``
    (``greedy.py``; a runner may hand in its compiled one); a :class:`GreedyPicker` also draws the
    other batches (:meth:`GreedyPicker.draw`: the compiled sort-free kernel where it has one), any
    other ``greedy`` leaves them to the eager :func:`~.sampling_kernels.draw_rows`. A picker that
    draws with the Triton kernel (:meth:`GreedyPicker.draws_with_seeds`) gets a seed per row
    instead of a uniform number."""
    if batch.all_greedy:
        return greedy(logits)
    settings = (batch.temperatures, batch.top_ks, batch.top_ps, batch.min_ps, batch.greedy)
    if isinstance(greedy, GreedyPicker) and greedy.draws_with_seeds(logits):
        seeds = _seeds(batch, logits.shape[0], logits.device)
        return greedy.kernel_draw(
            logits, *settings, seeds, filtered=batch.any_filter, top_k_rows=batch.any_top_k, top_p_rows=batch.any_top_p
        )
    draw = greedy.draw if isinstance(greedy, GreedyPicker) else draw_rows
    return draw(logits, *settings, _uniforms(batch, logits.shape[0], logits.device), filtered=batch.any_filter)
