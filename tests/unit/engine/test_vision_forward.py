"""One packed VLM micro-batch through ``MicroBatchForward`` (a plain model, no FSDP): the 3-D rotary
positions restart with every sequence and equal the model's own ``get_rope_index`` of each sequence
alone; image tokens without their images are refused, and so are images a text model cannot see;
the dummy image (several FSDP ranks) changes no score and gives the vision tower zero gradients."""

from __future__ import annotations

import itertools

import pytest
import torch

from areal_tasks.engine.fsdp.forward import ForwardSpec, MicroBatchForward
from areal_tasks.engine.microbatch import position_ids_from_cu_seqlens
from areal_tasks.engine.vision import VLMInputs, load_vision_language
from areal_tasks.errors import EngineError
from areal_tasks.kernels.attention import register_varlen_attention
from tests.unit.engine.vision_helpers import IMAGE_PAD, per_sequence, vision_batch


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def model(request, tiny_model_factory):
    return load_vision_language(str(tiny_model_factory(request.param)), register_varlen_attention(), torch.float32)


def _mb(**kwargs) -> dict[str, torch.Tensor]:
    batch = vision_batch(**kwargs)
    batch["position_ids"] = position_ids_from_cu_seqlens(batch["cu_seqlens"])
    return batch


def test_positions_restart_per_sequence_and_match_get_rope_index(model):
    mb = _mb(seed=4)
    vision = VLMInputs.of_model(model)
    bounds = tuple(mb["cu_seqlens"].tolist())
    positions = vision.position_ids(mb, bounds)
    assert positions.shape == (4, 1, bounds[-1])
    assert torch.equal(positions[0, 0], mb["position_ids"])
    for (a, b), item in zip(itertools.pairwise(bounds), per_sequence(mb)):
        ids = item["input_ids"][None]
        if "image_grid_thw" in item:
            alone, _ = model.model.get_rope_index(
                ids, mm_token_type_ids=(ids == IMAGE_PAD).int(), image_grid_thw=item["image_grid_thw"]
            )
            assert int(alone[1:].max()) < b - a - 1  # images compress positions: not the plain count
        else:
            alone = torch.arange(b - a).view(1, 1, -1).expand(3, 1, -1)
        assert torch.equal(positions[1:, :, a:b], alone)


def test_image_tokens_without_their_images_are_refused(model):
    mb = _mb(seed=5)
    forward = MicroBatchForward(model, ForwardSpec(role="actor"), None, vision=VLMInputs.of_model(model))
    with pytest.raises(EngineError, match="sequence 2 of the micro-batch has 12 image tokens but no image"):
        forward({**mb, "seq_n_images": torch.tensor([2, 0, 0])})
    text = mb["input_ids"].clone()
    text[(text == IMAGE_PAD).nonzero()[0]] = 5  # one placeholder short of the first sequence's images
    with pytest.raises(EngineError, match="has 8 image tokens, but its 2 images need 9"):
        forward({**mb, "input_ids": text})


def test_dummy_image_changes_no_score_and_gives_the_tower_zero_gradients(model):
    mb = _mb(seed=6, images=((), ()))
    mb = {k: v for k, v in mb.items() if k not in ("pixel_values", "image_grid_thw", "seq_n_images")}
    vision = VLMInputs.of_model(model)
    plain = MicroBatchForward(model, ForwardSpec(role="actor"), None, vision=vision)
    padded = MicroBatchForward(model, ForwardSpec(role="actor"), None, vision=vision, ensure_image=True)
    with torch.no_grad():
        expected = plain(mb)["logprobs"]
    model.zero_grad(set_to_none=True)
    out = padded(mb, with_entropy=True)
    assert out["logprobs"].shape == expected.shape and out["entropy"].shape == expected.shape
    torch.testing.assert_close(out["logprobs"], expected, atol=1e-6, rtol=1e-6)
    out["logprobs"].sum().backward()
    tower = {n: p.grad for n, p in model.named_parameters() if n.startswith("model.visual.")}
    assert tower and all(g is not None and g.abs().max() == 0 for g in tower.values())
    assert model.lm_head.weight.grad.abs().max() > 0


def test_a_text_model_refuses_a_micro_batch_with_images(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen2), dtype=torch.float32)
    mb = _mb(seed=7)
    mb["input_ids"] = mb["input_ids"] % 200
    with pytest.raises(EngineError, match="carries 3 images, but the model is not a vision-language model"):
        MicroBatchForward(model, ForwardSpec(role="actor"), None)(mb)
