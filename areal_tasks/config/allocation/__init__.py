"""Allocation-mode grammar: how an RL job's GPUs are split between inference and training.

``parse_allocation("sglang:d2+fsdp:d4")`` parses and validates a spec and returns an
:class:`AllocationMode` (2 + 4 = 6 GPUs). The language and its rules are in
``docs/allocation.md``; syntax lives in ``grammar.lark`` / :mod:`.parser`, the rules in
:mod:`.validate`. Torch-free: the CLI and Airflow DAGs import this.
"""

from __future__ import annotations

from areal_tasks.config.allocation.backends import INFERENCE_BACKENDS, TRAINING_BACKENDS
from areal_tasks.config.allocation.model import AllocationMode, Component, HybridDims, ParallelDims
from areal_tasks.config.allocation.parser import parse_raw
from areal_tasks.config.allocation.validate import build_allocation

__all__ = [
    "INFERENCE_BACKENDS",
    "TRAINING_BACKENDS",
    "AllocationMode",
    "Component",
    "HybridDims",
    "ParallelDims",
    "parse_allocation",
]


def parse_allocation(spec: str, total_gpus: int | None = None) -> AllocationMode:
    """Parse and validate ``spec``; with ``total_gpus``, also check that it fits the cluster.

    Raises :class:`~areal_tasks.errors.AllocationError` (position, caret and hint included) for
    any syntax or rule violation.
    """
    return build_allocation(spec, parse_raw(spec), total_gpus)
