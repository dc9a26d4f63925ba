"""The SFT warm start's data for a vision task: demonstrations of the ``shapes`` train split rendered
with their images (placeholders expanded, never trained), packed with the batch's image keys; a text
task's set stays as it was (no image keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from areal_tasks.api.batch import CU_SEQLENS, IMAGE_GRID_THW, INPUT_IDS, LOSS_MASK, PIXEL_VALUES, SEQ_N_IMAGES
from areal_tasks.config import load_config
from areal_tasks.engine.microbatch import dp_split
from areal_tasks.errors import ConfigError
from areal_tasks.models.tiny.vision_kit import VISION_IDS
from areal_tasks.models.tokenizer import load_tokenizer
from areal_tasks.trainer.sft_transcripts import build_sft_set

PAD = VISION_IDS["<|image_pad|>"]
SPEC = "demo:shapes?kind=colour&n_train=10&n_eval=2&wrong_fraction=0.3"


def config(tmp_path: Path, *overrides: str):
    return load_config(
        "configs/demo_vision_grpo.yaml", [f"experiment.run_dir={tmp_path}", f"dataset.path={SPEC}", *overrides]
    )


def test_vision_demonstrations_carry_their_images_into_the_batch(tmp_path: Path, tiny_qwen2_vl: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_qwen2_vl))
    demos = build_sft_set(config(tmp_path), tokenizer)
    assert len(demos) == 10 and demos.images is not None and len(demos.images) == 10
    answers = []
    for (ids, mask), images in zip(demos.transcripts, demos.images):
        assert ids.count(PAD) == 16 and not any(m for t, m in zip(ids, mask) if t == PAD)
        assert images is not None and images["image_grid_thw"].tolist() == [[1, 8, 8]]
        answers.append(tokenizer.decode([t for t, m in zip(ids, mask) if m]))
    assert all(a.startswith("Answer: ") and a.endswith("<|im_end|>") for a in answers)

    batch = demos.batch([3, 0, 7])
    assert batch[SEQ_N_IMAGES].tolist() == [1, 1, 1]
    assert batch[IMAGE_GRID_THW].shape == (3, 3) and batch[PIXEL_VALUES].shape == (3 * 64, 384)
    assert torch.equal(batch[PIXEL_VALUES][:64], demos.images[3]["pixel_values"])
    assert batch[INPUT_IDS][: batch[CU_SEQLENS][1]].tolist() == demos.transcripts[3][0]
    assert int(batch[LOSS_MASK].sum()) == sum(sum(demos.transcripts[i][1][1:]) for i in (3, 0, 7))
    # data-parallel shares keep each sequence's image with it
    first, second = dp_split(demos.batch([0, 1, 2, 3]), 2)
    assert first[SEQ_N_IMAGES].sum() + second[SEQ_N_IMAGES].sum() == 4
    assert first[PIXEL_VALUES].shape[0] == 64 * int(first[SEQ_N_IMAGES].sum())


def test_the_prompt_limit_counts_the_image_tokens(tmp_path: Path, tiny_qwen2_vl: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_qwen2_vl))
    with pytest.raises(ConfigError, match="dataset.max_prompt_len=60 drops every training prompt"):
        build_sft_set(config(tmp_path, "dataset.max_prompt_len=60"), tokenizer)  # the prompts are ~75 tokens


def test_a_text_task_has_no_image_keys(tmp_path: Path) -> None:
    cfg = load_config(
        "configs/demo_grpo.yaml",
        [f"experiment.run_dir={tmp_path}", "dataset.path=demo:arithmetic?n_train=6&n_eval=2"],
    )
    demos = build_sft_set(cfg, load_tokenizer("tiny:qwen2"))
    assert len(demos) == 6 and demos.images is None
    assert not {PIXEL_VALUES, IMAGE_GRID_THW, SEQ_N_IMAGES} & set(demos.batch([0, 1]))
