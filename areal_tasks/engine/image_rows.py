"""The image rows of a packed vision-language batch: which rows of ``image_grid_thw`` (one per image)
and of ``pixel_values`` (one per image patch) belong to which sequence.

Images are laid out sequence after sequence (``api/batch.py``): sequence ``i`` holds the next
``seq_n_images[i]`` images, and image ``j`` the next ``prod(image_grid_thw[j])`` patch rows. Selecting
sequences (micro-batches, data-parallel shares) takes their images and patches along, in the order
the sequences are selected. :func:`pack_images` builds the three keys from each sequence's own
pixel inputs (``Trajectory.multimodal``: what the image processor returned for its images).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from areal_tasks.api.batch import IMAGE_GRID_THW, PIXEL_VALUES, SEQ_N_IMAGES, VISION_KEYS
from areal_tasks.errors import EngineError

__all__ = ["check_image_keys", "has_images", "pack_images", "select_image_keys"]


def has_images(batch: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``batch`` carries the vision-language keys (it may still hold zero images)."""
    return IMAGE_GRID_THW in batch


def check_image_keys(batch: Mapping[str, torch.Tensor], n_seqs: int) -> None:
    """Refuse (EngineError) image keys that do not describe ``n_seqs`` sequences' images consistently;
    a batch without any of them passes."""
    present = VISION_KEYS & set(batch)
    if not present:
        return
    if present != VISION_KEYS:
        raise EngineError(
            f"a vision-language batch needs all of {sorted(VISION_KEYS)}, got only {sorted(present)}; "
            "pack pixel_values, image_grid_thw and seq_n_images together"
        )
    grid, counts, pixels = batch[IMAGE_GRID_THW], batch[SEQ_N_IMAGES], batch[PIXEL_VALUES]
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.is_floating_point():
        raise EngineError(f"{IMAGE_GRID_THW!r} must be an integer tensor [N, 3], got {tuple(grid.shape)} {grid.dtype}")
    if counts.dim() != 1 or counts.shape[0] != n_seqs:
        raise EngineError(f"{SEQ_N_IMAGES!r} must be [B] = [{n_seqs}], got {tuple(counts.shape)}")
    if bool((counts < 0).any()) or bool((grid <= 0).any()):
        raise EngineError(f"{SEQ_N_IMAGES!r} must be >= 0 and {IMAGE_GRID_THW!r} > 0")
    n_images = int(counts.sum())
    if n_images != grid.shape[0]:
        raise EngineError(f"{SEQ_N_IMAGES!r} counts {n_images} images but {IMAGE_GRID_THW!r} has {grid.shape[0]} rows")
    n_patches = int(grid.prod(-1).sum())
    if pixels.dim() != 2 or pixels.shape[0] != n_patches:
        raise EngineError(
            f"{PIXEL_VALUES!r} must be [P, D] with P = sum of prod({IMAGE_GRID_THW}) = {n_patches} rows, "
            f"got {tuple(pixels.shape)}"
        )


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` (int64)."""
    total = int(lengths.sum())
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts - offsets, lengths, output_size=total) + torch.arange(total)


def select_image_keys(batch: Mapping[str, torch.Tensor], seq_indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of the sequences ``seq_indices``, in that order (empty
    when the batch has no image keys; ``seq_n_images`` is per sequence and selected with the rest)."""
    if not has_images(batch):
        return {}
    grid = batch[IMAGE_GRID_THW].cpu().long()
    counts = batch[SEQ_N_IMAGES].cpu().long()
    seqs = torch.as_tensor(list(seq_indices), dtype=torch.long)
    images = _ranges((torch.cumsum(counts, 0) - counts)[seqs], counts[seqs])
    patches = grid.prod(-1)
    rows = _ranges((torch.cumsum(patches, 0) - patches)[images], patches[images])
    pixels, thw = batch[PIXEL_VALUES], batch[IMAGE_GRID_THW]
    return {
        PIXEL_VALUES: pixels.index_select(0, rows.to(pixels.device)),
        IMAGE_GRID_THW: thw.index_select(0, images.to(thw.device)),
    }


def pack_images(per_sequence: Sequence[Mapping[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """The image keys of a packed batch from every sequence's pixel inputs, in sequence order:
    ``{"pixel_values": [P_i, D], "image_grid_thw": [N_i, 3]}``, or None (or no image) for a text-only
    sequence. Empty (no keys) when no sequence has pixel inputs."""
    pixels: list[torch.Tensor] = []
    grids: list[torch.Tensor] = []
    counts: list[int] = []
    width = None
    for i, item in enumerate(per_sequence):
        if item is None:
            counts.append(0)
            continue
        missing = {PIXEL_VALUES, IMAGE_GRID_THW} - set(item)
        if missing:
            raise EngineError(f"sequence {i}: its pixel inputs lack {sorted(missing)} (have {sorted(item)})")
        pix, grid = torch.as_tensor(item[PIXEL_VALUES]), torch.as_tensor(item[IMAGE_GRID_THW])
        if grid.dim() != 2 or grid.shape[1] != 3:
            raise EngineError(f"sequence {i}: {IMAGE_GRID_THW} must be [N, 3], got {tuple(grid.shape)}")
        if pix.dim() != 2 or pix.shape[0] != int(grid.prod(-1).sum()):
            raise EngineError(
                f"sequence {i}: {PIXEL_VALUES} must be [sum(prod({IMAGE_GRID_THW})), D] = "
                f"[{int(grid.prod(-1).sum())}, D], got {tuple(pix.shape)}"
            )
        if grid.shape[0] == 0:  # a text-only sample's empty inputs (any width)
            counts.append(0)
            continue
        if width is not None and pix.shape[1] != width:
            raise EngineError(f"sequence {i}: {PIXEL_VALUES} rows have {pix.shape[1]} values, earlier ones {width}")
        width = int(pix.shape[1])
        pixels.append(pix.to(torch.float32))
        grids.append(grid.to(torch.long))
        counts.append(int(grid.shape[0]))
    if not grids:
        return {}
    return {
        PIXEL_VALUES: torch.cat(pixels),
        IMAGE_GRID_THW: torch.cat(grids),
        SEQ_N_IMAGES: torch.tensor(counts, dtype=torch.long),
    }
