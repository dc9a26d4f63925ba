"""LoRA targets exist in every tiny model and peft wraps exactly those modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from areal_tasks.errors import ModelError
from areal_tasks.models import TINY_FAMILIES, build_lora_config, lora_target_modules


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_targets_exist_and_peft_wraps_them(family: str, tiny_dirs: dict[str, Path]) -> None:
    from peft import get_peft_model

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[family]))
    targets = lora_target_modules(family)
    leaf_names = {
        name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
    }
    assert set(targets) <= leaf_names

    wrapped = get_peft_model(model, build_lora_config(4, 8.0, 0.0, None, family))
    adapted = {name.split(".")[-4] for name, _ in wrapped.named_parameters() if name.endswith("lora_A.default.weight")}
    assert adapted == set(targets)
    trainable = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_model_type_alias_is_accepted() -> None:
    assert lora_target_modules("gemma3_text") == lora_target_modules("gemma3")


def test_moe_defaults_to_attention_only() -> None:
    assert lora_target_modules("qwen3_moe") == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert "gate_proj" in lora_target_modules("qwen3")


def test_explicit_targets_and_config_fields() -> None:
    config = build_lora_config(8, 16.0, 0.05, ["q_proj", "v_proj"], "llama")
    assert (config.r, config.lora_alpha, config.lora_dropout) == (8, 16.0, 0.05)
    assert set(config.target_modules) == {"q_proj", "v_proj"}


@pytest.mark.parametrize(
    ("rank", "alpha", "dropout", "targets", "match"),
    [
        (0, 8.0, 0.0, None, "rank"),
        (4, 0.0, 0.0, None, "alpha"),
        (4, 8.0, 1.0, None, "dropout"),
        (4, 8.0, 0.0, [], "empty"),
    ],
)
def test_invalid_lora_settings(rank: int, alpha: float, dropout: float, targets: list[str] | None, match: str) -> None:
    with pytest.raises(ModelError, match=match):
        build_lora_config(rank, alpha, dropout, targets, "llama")


def test_unknown_family_needs_explicit_targets() -> None:
    with pytest.raises(ModelError, match="pass target_modules"):
        lora_target_modules("unknown")
