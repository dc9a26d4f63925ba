"""What each backend accepts: its kind, its parallel dims, and the words used to refuse the rest.

One table per fact. The inference side is derived from the inference-backend registry
(:mod:`areal_tasks.inference.registry`: names and dims) and the built training backends from the
engine registry (:mod:`areal_tasks.engine.registry`: names and the dims each runs), so adding a
backend is one registration there. The grammar also knows training backends that are planned but
not built (:data:`PLANNED_TRAINING_BACKENDS`), so that layouts for them parse and their problems can
be named; validation refuses them before anything starts.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from areal_tasks.config.allocation.model import ComponentKind
from areal_tasks.engine.registry import built_backends, hybrid_backends, supported_dims
from areal_tasks.inference.registry import inference_backend, inference_backend_names


@dataclass(frozen=True)
class PlannedTrainingBackend:
    """What a training backend that is not built yet will run."""

    #: the allocation dims it takes (``dtpce``).
    dims: str
    #: whether it takes the MoE hybrid form ``backend:(attn:...|ffn:...)``.
    hybrid: bool
    #: whether it needs GPUs (``cluster.gpus_per_node: 0`` refuses it).
    gpu_only: bool


#: training backends the grammar knows that are not built yet (their issues are open).
PLANNED_TRAINING_BACKENDS: dict[str, PlannedTrainingBackend] = {
    "megatron": PlannedTrainingBackend(dims="dtpce", hybrid=True, gpu_only=True),
}

INFERENCE_BACKENDS: tuple[str, ...] = inference_backend_names()
BUILT_TRAINING_BACKENDS: tuple[str, ...] = built_backends()
TRAINING_BACKENDS: tuple[str, ...] = BUILT_TRAINING_BACKENDS + tuple(PLANNED_TRAINING_BACKENDS)
ALL_BACKENDS: tuple[str, ...] = INFERENCE_BACKENDS + TRAINING_BACKENDS

#: training backends that accept the MoE hybrid form ``backend:(attn:...|ffn:...)``.
HYBRID_BACKENDS: tuple[str, ...] = tuple(name for name, plan in PLANNED_TRAINING_BACKENDS.items() if plan.hybrid) + (
    hybrid_backends()
)
#: training backends that cannot run without GPUs.
GPU_ONLY_TRAINING_BACKENDS: frozenset[str] = frozenset(
    name for name, plan in PLANNED_TRAINING_BACKENDS.items() if plan.gpu_only
)

DIM_NAMES: dict[str, str] = {
    "d": "data",
    "t": "tensor",
    "p": "pipeline",
    "c": "context",
    "e": "expert",
}

#: the dims each backend accepts.
ALLOWED_DIMS: dict[str, str] = {
    **{name: inference_backend(name).dims for name in INFERENCE_BACKENDS},
    **{name: supported_dims(name) for name in BUILT_TRAINING_BACKENDS},
    **{name: plan.dims for name, plan in PLANNED_TRAINING_BACKENDS.items()},
}

#: the dims each half of a hybrid layout accepts.
HYBRID_PART_DIMS: dict[str, str] = {"attn": "dtpc", "ffn": "dtpe"}

DIMS_HINT = "dims are d (data), t (tensor), p (pipeline), c (context), e (expert), each with its size, e.g. d4t2"


def kind_of(backend: str) -> ComponentKind:
    """``"inference"`` or ``"training"`` for a known backend."""
    return "inference" if backend in INFERENCE_BACKENDS else "training"


def closest(word: str, choices: tuple[str, ...] | list[str]) -> str | None:
    """The choice most like ``word`` (a typo's likely intent), or None when nothing is close."""
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return matches[0] if matches else None


def backend_hint(word: str) -> str:
    """Hint for an unknown backend: the closest valid one, then the full list."""
    listing = f"inference: {', '.join(INFERENCE_BACKENDS)}; training: {', '.join(TRAINING_BACKENDS)}"
    guess = closest(word, ALL_BACKENDS)
    return f"did you mean '{guess}'? ({listing})" if guess else f"valid backends are {listing}"


_FSDP_RUNS = "fsdp runs d (data), t (tensor) and c (context)"
_FSDP_REFUSALS: dict[str, tuple[str, str]] = {
    "p": (
        "FSDP has no pipeline parallelism",
        f"use megatron (or archon) for pipeline parallelism, or drop p; {_FSDP_RUNS}",
    ),
    "e": (
        "FSDP has no expert parallelism",
        f"use megatron or archon for MoE expert parallelism, or drop e; {_FSDP_RUNS}",
    ),
}

_INFERENCE_REFUSALS: dict[str, tuple[str, str]] = {
    "c": (
        "inference backend {backend} takes no context-parallel dim (c)",
        "drop c: context (Ulysses sequence) parallelism applies to training backends only",
    ),
    "e": (
        "inference backend {backend} takes no expert-parallel dim (e)",
        "drop e: the inference server places experts over its own t/d ranks",
    ),
}


def refusal(backend: str, letter: str) -> tuple[str, str]:
    """(message, hint) for a dim that ``backend`` does not accept (per :data:`ALLOWED_DIMS`)."""
    if backend == "fsdp":
        return _FSDP_REFUSALS[letter]
    message, hint = _INFERENCE_REFUSALS[letter]
    return message.format(backend=backend), hint
