"""Shared pieces of the vision-language engine tests: packed batches with images of the tiny VLMs
(``build_tiny_vlm``), a token-mean loss, and transformers' own scores of each sequence run alone
(no packing, default attention, positions from the model's own ``get_rope_index``)."""

from __future__ import annotations

import itertools

import torch

from areal_tasks.models.tiny.vision_kit import MERGE_SIZE, PATCH_SIZE, TEMPORAL_PATCH_SIZE, VISION_IDS

IMAGE_PAD = VISION_IDS["<|image_pad|>"]
VISION_START = VISION_IDS["<|vision_start|>"]
VISION_END = VISION_IDS["<|vision_end|>"]
#: columns of a ``pixel_values`` row: 3 channels x temporal patch x patch x patch
PATCH_DIM = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE

#: three sequences: two images of different sizes, none, one image (grids in patches)
DEFAULT_IMAGES: tuple[tuple[tuple[int, int, int], ...], ...] = (((1, 4, 8), (1, 2, 2)), (), ((1, 8, 6),))


def vision_batch(seed: int = 0, images=DEFAULT_IMAGES, vocab: int = 1024) -> dict[str, torch.Tensor]:
    """A packed batch: per sequence, some text, then each image's ``vision_start``, expanded pads and
    ``vision_end`` with text after, then more text; random pixel values; a loss mask over the text
    after the first image (or after the first token), and random advantages."""
    gen = torch.Generator().manual_seed(seed)
    seqs, masks = [], []
    for grids in images:
        ids = torch.randint(0, vocab, (3,), generator=gen).tolist()
        for t, h, w in grids:
            ids += [VISION_START] + [IMAGE_PAD] * (t * h * w // MERGE_SIZE**2) + [VISION_END]
            ids += torch.randint(0, vocab, (2,), generator=gen).tolist()
        prompt = len(ids)
        ids += torch.randint(0, vocab, (5,), generator=gen).tolist()
        seqs.append(ids)
        masks.append([0] * prompt + [1] * (len(ids) - prompt))
    grids = [g for group in images for g in group]
    cu = torch.tensor([0, *itertools.accumulate(len(s) for s in seqs)], dtype=torch.int32)
    total = int(cu[-1])
    return {
        "input_ids": torch.tensor([t for s in seqs for t in s]),
        "cu_seqlens": cu,
        "loss_mask": torch.tensor([m for s in masks for m in s], dtype=torch.int32),
        "advantages": torch.randn(total, generator=gen),
        "pixel_values": torch.randn(sum(t * h * w for t, h, w in grids), PATCH_DIM, generator=gen),
        "image_grid_thw": torch.tensor(grids, dtype=torch.long).view(-1, 3),
        "seq_n_images": torch.tensor([len(g) for g in images], dtype=torch.long),
    }


def per_sequence(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Each sequence's ``input_ids`` and, when it has images, its ``pixel_values`` and ``image_grid_thw``."""
    cu = batch["cu_seqlens"].tolist()
    counts = batch["seq_n_images"].tolist()
    grid = batch["image_grid_thw"]
    patches = grid.prod(-1).tolist()
    out, image, row = [], 0, 0
    for (a, b), n in zip(itertools.pairwise(cu), counts):
        item = {"input_ids": batch["input_ids"][a:b]}
        if n:
            n_rows = sum(patches[image : image + n])
            item["pixel_values"] = batch["pixel_values"][row : row + n_rows]
            item["image_grid_thw"] = grid[image : image + n]
            image, row = image + n, row + n_rows
        out.append(item)
    return out


def reference_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Aligned per-token log-probs of transformers' forward, one sequence at a time (differentiable)."""
    out = []
    for item in per_sequence(batch):
        ids = item["input_ids"][None]
        kwargs = {}
        if "image_grid_thw" in item:
            kwargs = {
                "pixel_values": item["pixel_values"],
                "image_grid_thw": item["image_grid_thw"],
                "mm_token_type_ids": (ids == IMAGE_PAD).int(),
            }
        logits = model(input_ids=ids, **kwargs).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        out.append(torch.cat([lp.new_zeros(1), lp]))
    return torch.cat(out)


def token_mean_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    """``-mean(logprob * advantage)`` over the micro-batch's masked tokens (0 when it has none)."""
    mask = mb["loss_mask"].float()
    loss = -(outputs["logprobs"] * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {}


def token_weight(mb: dict) -> float:
    return float(mb["loss_mask"].sum())


def load_reference(model_dir) -> torch.nn.Module:
    """transformers' own model of ``model_dir`` in fp32 (default attention)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
