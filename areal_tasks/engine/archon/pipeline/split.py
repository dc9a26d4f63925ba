"""Splitting the decoder layers into contiguous pipeline stages of balanced cost.

A stage's cost is the sum of its layers' costs, plus ``first_extra`` for the first stage (the token
embedding) and ``last_extra`` for the last one (final norm and LM/value head). :func:`split_layers`
minimises the largest stage cost exactly (a small dynamic programme: layer and stage counts are in
the tens), and among the splits with that bottleneck picks the one with the smallest sum of squared
stage costs, so the remaining stages are as even as they can be. Every stage gets at least one layer:
a stage with no layer would still pay a send/receive per micro-batch for nothing.

The costs come from the model's arguments (:func:`stage_costs`): ``params`` (parameter count: memory
balance), ``flops`` (active FLOPs per token: compute balance, the right one for MoE models where a
layer's parameters are mostly experts that a token does not visit) or ``layers`` (every layer 1, no
extras).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any, Literal

from areal_tasks.errors import EngineError

logger = logging.getLogger(__name__)

#: what :func:`stage_costs` balances.
Balance = Literal["params", "flops", "layers"]
BALANCES: tuple[str, ...] = ("params", "flops", "layers")

_REL_TOL = 1e-9


def split_layers(
    costs: Sequence[float], n_stages: int, *, first_extra: float = 0.0, last_extra: float = 0.0
) -> list[range]:
    """Contiguous layer ranges, one per stage, minimising the largest stage cost.

    ``costs[i]`` is layer ``i``'s cost; ``first_extra``/``last_extra`` are added to the first/last
    stage (with one stage, both). Raises :class:`EngineError` when there are fewer layers than stages
    or a cost is negative or not finite.
    """
    n_layers = len(costs)
    if isinstance(n_stages, bool) or not isinstance(n_stages, int) or n_stages < 1:
        raise EngineError(f"n_stages must be an integer >= 1, got {n_stages!r}")
    if n_layers < n_stages:
        raise EngineError(
            f"cannot split {n_layers} decoder layers into n_stages={n_stages} pipeline stages "
            "(pp x stages_per_rank): every stage needs at least one layer; lower the pipeline degree "
            "or the stages per rank"
        )
    values = [float(c) for c in (*costs, first_extra, last_extra)]
    if any(not math.isfinite(c) or c < 0 for c in values):
        raise EngineError(f"layer costs and extras must be finite and >= 0, got {values}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def cost(stage: int, start: int, end: int) -> float:
        extra = (first_extra if stage == 0 else 0.0) + (last_extra if stage == n_stages - 1 else 0.0)
        return prefix[end] - prefix[start] + extra

    bottleneck = _min_bottleneck(cost, n_layers, n_stages)
    limit = bottleneck * (1 + _REL_TOL) + _REL_TOL
    bounds = _min_squares_under(cost, n_layers, n_stages, limit)
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def _min_bottleneck(cost: Any, n_layers: int, n_stages: int) -> float:
    """The smallest achievable largest stage cost (``best[k][i]``: first ``i`` layers in ``k`` stages)."""
    inf = math.inf
    best = [[inf] * (n_layers + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        # stage k-1 ends at layer i and leaves >= 1 layer for each later stage
        for i in range(k, n_layers - (n_stages - k) + 1):
            best[k][i] = min(max(best[k - 1][j], cost(k - 1, j, i)) for j in range(k - 1, i))
    return best[n_stages][n_layers]


def _min_squares_under(cost: Any, n_layers: int, n_stages: int, limit: float) -> list[int]:
    """The stage boundaries with the least sum of squared costs among splits with every stage <= ``limit``."""
    inf = math.inf
    best = [[inf] * (n_layers + 1) for _ in range(n_stages + 1)]
    back = [[0] * (n_layers + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n_layers - (n_stages - k) + 1):
            for j in range(k - 1, i):
                c = cost(k - 1, j, i)
                if c > limit or best[k - 1][j] == inf:
                    continue
                value = best[k - 1][j] + c * c
                if value < best[k][i]:
                    best[k][i], back[k][i] = value, j
    bounds = [n_layers]
    for k in range(n_stages, 0, -1):
        bounds.append(back[k][bounds[-1]])
    return bounds[::-1]


def stage_costs(args: Any, by: Balance = "params") -> tuple[list[float], float, float]:
    """``(layer costs, first_extra, last_extra)`` of an ``ArchonArgs`` for :func:`split_layers`.

    ``params``: ``args.layer_param_count(i)``, the embedding's and the head's parameter counts;
    ``flops``: ``args.layer_flops_per_token(i)``, no embedding cost (a lookup) and ``2 x`` the head's
    parameters (one matmul per token); ``layers``: 1 per layer, no extras.
    """
    n_layers = int(args.n_layers)
    if by == "params":
        return (
            [float(args.layer_param_count(i)) for i in range(n_layers)],
            float(args.embed_param_count),
            float(args.head_param_count),
        )
    if by == "flops":
        return [float(args.layer_flops_per_token(i)) for i in range(n_layers)], 0.0, 2.0 * float(args.head_param_count)
    if by == "layers":
        return [1.0] * n_layers, 0.0, 0.0
    raise EngineError(f"pipeline balance must be one of {BALANCES}, got {by!r}")


def balanced_split(args: Any, n_stages: int, by: Balance = "params") -> list[range]:
    """:func:`split_layers` of ``args``' layers into ``n_stages`` stages balanced ``by`` one of :data:`BALANCES`."""
    costs, first, last = stage_costs(args, by)
    ranges = split_layers(costs, n_stages, first_extra=first, last_extra=last)
    logger.info("pipeline split (%s) of %d layers: %s", by, len(costs), [(r.start, r.stop) for r in ranges])
    return ranges
