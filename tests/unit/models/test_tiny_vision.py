"""The tiny vision-language models: both families build, load, run with images, are detected exactly;
the processor expands image placeholders as the model expects; hostile images are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from areal_tasks.errors import ModelError
from areal_tasks.models import build_tiny_model, detect_model
from areal_tasks.models.tiny.vision_kit import TINY_VLM_VOCAB_SIZE, VISION_FAMILIES, VISION_IDS
from areal_tasks.models.vision_processor import (
    VisionProcessor,
    expand_image_pads,
    mm_token_type_ids,
)

CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many shapes?"}]}]


@pytest.fixture(scope="module", params=VISION_FAMILIES)
def vlm_dir(request: pytest.FixtureRequest, tiny_model_factory) -> Path:
    return tiny_model_factory(request.param)


def test_vlm_loads_runs_with_images_and_is_detected(vlm_dir: Path) -> None:
    model = AutoModelForImageTextToText.from_pretrained(str(vlm_dir))
    processor = VisionProcessor.from_pretrained(vlm_dir)
    images = [Image.new("RGB", (50, 40), (255, 0, 0)), Image.new("RGB", (64, 64), (0, 0, 255))]
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Same?"}]}]
    inputs = processor.encode_chat(chat, images)
    # 50x40 is resized to 48x32 (multiples of patch 8 x merge 2): 6x4 patches -> 6 tokens; 64x64: 16 tokens
    assert inputs.image_grid_thw.tolist() == [[1, 4, 6], [1, 8, 8]]
    assert inputs.input_ids.count(VISION_IDS["<|image_pad|>"]) == 6 + 16
    assert inputs.pixel_values.shape == (24 + 64, 3 * 2 * 8 * 8)
    ids = torch.tensor([inputs.input_ids])
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            pixel_values=inputs.pixel_values,
            image_grid_thw=inputs.image_grid_thw,
            mm_token_type_ids=mm_token_type_ids(ids, processor.image_token_id),
        ).logits
    assert logits.shape == (1, len(inputs.input_ids), TINY_VLM_VOCAB_SIZE) and torch.isfinite(logits).all()

    info = detect_model(str(vlm_dir))
    assert info.is_vision_language and info.to_dict()["text_family"] == "qwen2"
    assert info.num_parameters == sum(p.numel() for p in model.parameters())
    assert info.num_vision_parameters == sum(p.numel() for n, p in model.named_parameters() if "visual" in n)


def test_image_changes_the_logits(tiny_qwen2_vl: Path) -> None:
    """The vision tower is wired in: a different image gives different next-token logits."""
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_qwen2_vl))
    processor = VisionProcessor.from_pretrained(tiny_qwen2_vl)
    outs = []
    for colour in ((255, 0, 0), (0, 255, 0)):
        inputs = processor.encode_chat(CHAT, [Image.new("RGB", (32, 32), colour)])
        ids = torch.tensor([inputs.input_ids])
        with torch.no_grad():
            outs.append(
                model(
                    input_ids=ids,
                    pixel_values=inputs.pixel_values,
                    image_grid_thw=inputs.image_grid_thw,
                    mm_token_type_ids=mm_token_type_ids(ids, processor.image_token_id),
                ).logits[0, -1]
            )
    assert not torch.allclose(outs[0], outs[1])


def test_seed_and_overrides(tiny_model_factory, tmp_path: Path) -> None:
    a = build_tiny_model("qwen2_vl", seed=1, cache_dir=tmp_path)
    again = build_tiny_model("qwen2_vl", seed=1, cache_dir=tmp_path)
    assert a == again
    wide = build_tiny_model("qwen2_vl", seed=1, cache_dir=tmp_path, hidden_size=128, num_attention_heads=8)
    assert detect_model(str(wide)).to_dict()["hidden_size"] == 128
    with pytest.raises(ModelError, match="hiden_size"):
        build_tiny_model("qwen2_vl", cache_dir=tmp_path, hiden_size=8)
    with pytest.raises(ModelError, match="multiple of num_attention_heads"):
        build_tiny_model("qwen2_vl", cache_dir=tmp_path, hidden_size=66)
    with pytest.raises(ModelError, match="qwen2_vl"):
        build_tiny_model("qwen9_vl", cache_dir=tmp_path)


def test_expand_image_pads() -> None:
    pad = 7
    assert expand_image_pads([1, pad, 2, pad, 3], pad, [2, 3]) == [1, pad, pad, 2, pad, pad, pad, 3]
    with pytest.raises(ModelError, match="1 image placeholder"):
        expand_image_pads([1, pad, 2], pad, [2, 3])
