"""Detection from synthetic config.json files: families, MoE/VL flags, sizes, unknown families, errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.errors import ModelError
from areal_tasks.models import detect_model, model_info_from_config

GEMMA_2B = {
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "hidden_size": 2048,
    "intermediate_size": 16384,
    "num_hidden_layers": 18,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
QWEN2_VL_2B = {  # the flat (pre-v5) layout of Qwen2-VL-2B-Instruct's config.json
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "depth": 32,
        "embed_dim": 1280,
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_chans": 3,
        "hidden_size": 1536,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


def test_gemma_dense_tied() -> None:
    info = model_info_from_config(GEMMA_2B)
    assert (info.family, info.architecture, info.is_moe, info.is_vision_language) == (
        "gemma",
        "GemmaForCausalLM",
        False,
        False,
    )
    assert info.dims.tie_word_embeddings  # gemma's class default, absent from this config
    assert (info.dims.num_kv_heads, info.dims.head_dim, info.dims.context_length, info.torch_dtype) == (
        1,
        256,
        8192,
        "bfloat16",
    )
    assert info.num_parameters == info.num_active_parameters
    assert 2.4e9 < info.num_parameters < 2.6e9  # Gemma-2B: 2.51B


def test_mixtral_moe_counts() -> None:
    info = model_info_from_config(MIXTRAL_8X7B)
    assert (info.family, info.is_moe, info.dims.num_experts, info.dims.experts_per_token) == ("mixtral", True, 8, 2)
    assert round(info.num_parameters / 1e9, 1) == 46.7  # Mixtral-8x7B: 46.7B total
    assert round(info.num_active_parameters / 1e9, 1) == 12.9  # 12.9B active


def test_qwen3_moe_counts() -> None:
    info = model_info_from_config(QWEN3_30B_A3B)
    assert (info.family, info.is_moe, info.dims.num_experts, info.dims.experts_per_token) == ("qwen3_moe", True, 128, 8)
    assert round(info.num_parameters / 1e9, 1) == 30.5  # "30B-A3B": 30.5B total
    assert 3.3e9 < info.num_active_parameters < 3.4e9  # "A3B": 3.3B active (3.35B with embeddings)


def test_vision_language_counts_text_and_tower() -> None:
    info = model_info_from_config(QWEN2_VL_2B)
    assert (info.family, info.is_vision_language, info.is_moe) == ("qwen2_vl", True, False)
    assert info.dims.hidden_size == 1536 and info.dims.num_layers == 28
    assert 0.6e9 < info.num_vision_parameters < 0.7e9  # the 675M ViT + merger
    assert round(info.num_parameters / 1e9, 2) == 2.21  # Qwen2-VL-2B: 2.21B


def test_family_from_architectures_when_model_type_missing() -> None:
    config = {k: v for k, v in MIXTRAL_8X7B.items() if k != "model_type"}
    assert model_info_from_config(config).family == "mixtral"


def test_unknown_family_is_reported_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    config: dict[str, Any] = {
        "architectures": ["FancyNewForCausalLM"],
        "model_type": "fancy_new",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 1000,
    }
    with caplog.at_level(logging.WARNING, logger="areal_tasks.models.info"):
        info = model_info_from_config(config, source="fancy-dir")
    assert info.family == "unknown" and info.architecture == "FancyNewForCausalLM"
    assert info.warnings and "fancy_new" in info.warnings[0]
    assert any("unknown model family" in record.message for record in caplog.records)
    assert info.num_parameters > 0 and info.dims.num_kv_heads == 4


def test_missing_size_names_key_and_source() -> None:
    config = {k: v for k, v in GEMMA_2B.items() if k != "hidden_size"}
    with pytest.raises(ModelError, match=r"my-model.*hidden_size"):
        model_info_from_config(config, source="my-model")


def _write(directory: Path, config: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def test_detect_local_directory_and_config_file(tmp_path: Path) -> None:
    directory = _write(tmp_path / "mixtral", MIXTRAL_8X7B)
    by_dir = detect_model(str(directory))
    by_file = detect_model(str(directory / "config.json"))
    assert by_dir.family == by_file.family == "mixtral"
    assert by_dir.source == str(directory)


def test_detect_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no config.json"):
        detect_model(str(tmp_path))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match="not valid JSON"):
        detect_model(str(tmp_path / "bad"))
    with pytest.raises(ModelError, match="no such model directory"):
        detect_model(str(tmp_path / "missing" / "deeper"))
    with pytest.raises(ModelError, match="JSON object"):
        detect_model(str(_write(tmp_path / "list", [1, 2])))


def test_unreachable_hub_id_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id: str, filename: str, **_: Any) -> str:
        raise LocalEntryNotFoundError(f"cannot find {repo_id}/{filename}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(
        ModelError, match=r"'Qwen/Qwen2-0.5B'.*could not be reached.*local model directory.*HF_ENDPOINT"
    ):
        detect_model("Qwen/Qwen2-0.5B")
