"""Reward shaping: affine transform and clipping of scalar rewards, and DAPO's overlong penalty.

``shape_rewards(r) = clip((r + bias) * scale, -clip, clip)``.

DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), with ``L_max`` the generation budget and
``L_cache`` the buffer::

    R_len(|y|) = 0                                   if |y| <= L_max - L_cache
               = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
               = -1                                  if |y| > L_max

times ``factor``, added to the task reward. Departure: ``|y|`` is the number of trained
(loss-masked) tokens of the sequence, which equals the response length for single-turn episodes
and excludes tool output in multi-turn ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.errors import AlgorithmError


def shape_rewards(rewards: Tensor, bias: float = 0.0, scale: float = 1.0, clip: float | None = None) -> Tensor:
    """``clip((rewards + bias) * scale, -clip, clip)``; ``clip=None`` leaves the range open."""
    out = (rewards + bias) * scale
    if clip is not None:
        if clip <= 0:
            raise AlgorithmError(f"shape_rewards: clip must be > 0, got {clip}")
        out = out.clamp(-clip, clip)
    return out


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, factor: float = 1.0) -> Tensor:
    """DAPO's length penalty in ``[-factor, 0]`` for response lengths ``[B]`` (float result)."""
    if not 0 <= buffer_len < max_len:
        raise AlgorithmError(f"overlong_penalty needs 0 <= buffer_len < max_len, got {buffer_len}, {max_len}")
    lengths = lengths.to(torch.float64)
    soft_start = max_len - buffer_len
    if buffer_len == 0:
        penalty = torch.where(lengths > max_len, -1.0, 0.0).to(torch.float64)
    else:
        ramp = (soft_start - lengths) / buffer_len
        penalty = torch.where(lengths <= soft_start, 0.0, torch.where(lengths <= max_len, ramp, -1.0))
    return (penalty * factor).to(torch.get_default_dtype())
