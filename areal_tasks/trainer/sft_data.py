"""SFT batches: chat transcripts packed into the layout of ``api/batch.py`` and the SFT loss.

:func:`pack_transcripts` concatenates ``(input_ids, assistant_mask)`` pairs; ``loss_mask`` is the
assistant mask with the first token of every sequence forced to 0 (it has no log-probability).
:func:`sft_loss` follows the engine's loss contract: the token mean of ``-logprobs`` over
``loss_mask``; :func:`sft_loss_weight` counts those tokens, so the engine's weighting makes the
step loss the mean over every loss token of the global batch.
Transcripts of a vision-language model pass their images along (``images``: each transcript's
``{"pixel_values", "image_grid_thw"}`` or None), packed as ``api/batch.py``'s image keys.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.api.batch import CU_SEQLENS, INPUT_IDS, LOSS_MASK, POSITION_IDS
from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Transcript = tuple[Sequence[int], Sequence[int]]


def pack_transcripts(
    transcripts: Sequence[Transcript], images: Sequence[Mapping[str, Any] | None] | None = None
) -> dict[str, torch.Tensor]:
    """A packed batch (``input_ids``, ``cu_seqlens``, ``position_ids``, ``loss_mask``) of ``transcripts``;
    with ``images`` (one entry per transcript) also ``pixel_values``, ``image_grid_thw``, ``seq_n_images``."""
    import torch

    from areal_tasks.engine.image_rows import pack_images
    from areal_tasks.errors import EngineError

    if not transcripts:
        raise ConfigError("cannot pack an empty list of transcripts")
    if images is not None and len(images) != len(transcripts):
        raise ConfigError(f"got images for {len(images)} transcripts, but {len(transcripts)} transcripts")
    ids: list[int] = []
    mask: list[int] = []
    positions: list[int] = []
    cu = [0]
    for i, (seq_ids, seq_mask) in enumerate(transcripts):
        if len(seq_ids) != len(seq_mask) or len(seq_ids) < 2:
            raise ConfigError(
                f"transcript {i}: needs >= 2 tokens and a mask of the same length "
                f"(got {len(seq_ids)} ids, {len(seq_mask)} mask values)"
            )
        ids.extend(int(t) for t in seq_ids)
        mask.append(0)  # the first token has no log-probability
        mask.extend(1 if m else 0 for m in list(seq_mask)[1:])
        positions.extend(range(len(seq_ids)))
        cu.append(cu[-1] + len(seq_ids))
    try:
        packed_images = pack_images(images) if images is not None else {}
    except EngineError as exc:
        raise ConfigError(f"cannot pack the transcripts' images: {exc}") from exc
    return {
        INPUT_IDS: torch.tensor(ids, dtype=torch.long),
        CU_SEQLENS: torch.tensor(cu, dtype=torch.int32),
        POSITION_IDS: torch.tensor(positions, dtype=torch.long),
        LOSS_MASK: torch.tensor(mask, dtype=torch.int32),
        **packed_images,
    }


def sft_loss(
    outputs: dict[str, torch.Tensor], mb: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token mean of ``-logprobs`` over ``loss_mask`` (0 for a micro-batch without loss tokens)."""
    mask = mb[LOSS_MASK].to(outputs["logprobs"].dtype)
    denom = mask.sum().clamp(min=1.0)
    nll = -(outputs["logprobs"] * mask).sum() / denom
    return nll, {}


def sft_loss_weight(mb: dict[str, torch.Tensor]) -> float:
    """The number of loss tokens of the micro-batch."""
    return float(mb[LOSS_MASK].sum())
