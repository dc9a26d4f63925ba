"""The tiny-model kit: every family builds, loads, runs, is detected exactly; seeds, cache and copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal_tasks.errors import ModelError
from areal_tasks.models import TINY_FAMILIES, build_tiny_model, detect_model
from areal_tasks.models.tiny.cache import cache_root
from areal_tasks.models.tiny.kit import tiny_config

MOE_FAMILIES = {"qwen2_moe", "qwen3_moe", "mixtral"}


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_family_loads_runs_and_is_detected(family: str, tiny_dirs: dict[str, Path]) -> None:
    path = tiny_dirs[family]
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (path / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    assert model.dtype == torch.float32
    ids = tokenizer("What is 12 + 7?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()

    info = detect_model(str(path))
    assert info.family == family and info.is_moe == (family in MOE_FAMILIES)
    assert info.num_parameters == sum(p.numel() for p in model.parameters())
    assert info.dims.vocab_size == len(tokenizer) == model.config.vocab_size
    assert (info.dims.hidden_size, info.dims.num_layers, info.dims.num_attention_heads, info.dims.num_kv_heads) == (
        64,
        2,
        4,
        2,
    )
    if info.is_moe:
        assert (info.dims.num_experts, info.dims.experts_per_token) == (4, 2)
        assert info.num_active_parameters < info.num_parameters


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_special_token_ids_agree(family: str, tiny_dirs: dict[str, Path]) -> None:
    path = tiny_dirs[family]
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    config = json.loads((path / "config.json").read_text())
    generation = json.loads((path / "generation_config.json").read_text())
    assert config["eos_token_id"] == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config["pad_token_id"] == generation["pad_token_id"] == tokenizer.pad_token_id
    assert config["bos_token_id"] == generation["bos_token_id"] == tokenizer.bos_token_id
    assert generation["eos_token_id"][0] == tokenizer.eos_token_id
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") in generation["eos_token_id"]


def test_seed_changes_weights_not_shapes(tiny_dirs: dict[str, Path]) -> None:
    first = load_file(str(tiny_dirs["qwen2"] / "model.safetensors"))
    again = load_file(str(build_tiny_model("qwen2", seed=0) / "model.safetensors"))
    other = load_file(str(build_tiny_model("qwen2", seed=1) / "model.safetensors"))
    assert first.keys() == other.keys()
    assert all(first[k].shape == other[k].shape for k in first)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_cache_hit_reuses_entry(tiny_dirs: dict[str, Path]) -> None:
    path = tiny_dirs["llama"]
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model("llama") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert path.parent == cache_root()


def test_out_dir_gets_an_independent_copy(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    out = build_tiny_model("mistral", out_dir=tmp_path / "m")
    assert out == tmp_path / "m"
    (out / "model.safetensors").write_bytes(b"overwritten")
    assert (tiny_dirs["mistral"] / "model.safetensors").stat().st_size > 1000  # the cache is untouched
    assert detect_model(str(out)).family == "mistral"


def test_overrides_and_private_cache_dir(tmp_path: Path) -> None:
    path = build_tiny_model("llama", cache_dir=tmp_path, num_hidden_layers=3)
    assert path.parent == tmp_path
    assert detect_model(str(path)).dims.num_layers == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_env_var_selects_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "tiny"
    assert cache_root("/elsewhere") == Path("/elsewhere")


def test_tiny_prefix_detects_family() -> None:
    info = detect_model("tiny:qwen3_moe")
    assert (info.family, info.is_moe, info.dims.vocab_size) == ("qwen3_moe", True, 1024)


def test_bad_family_and_vocab_override_raise() -> None:
    with pytest.raises(ModelError, match=r"'phi'.*llama"):
        build_tiny_model("phi")
    with pytest.raises(ModelError, match="vocab_size"):
        build_tiny_model("llama", vocab_size=5000)


def test_unknown_override_key_raises_before_building(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"unknown llama config key\(s\) hiden_size"):
        build_tiny_model("llama", cache_dir=tmp_path, hiden_size=128)
    assert not list(tmp_path.iterdir())


def test_head_dim_follows_width_unless_overridden() -> None:
    assert tiny_config("qwen2")["head_dim"] == 16
    assert tiny_config("qwen2", hidden_size=128, num_attention_heads=4)["head_dim"] == 32
    assert tiny_config("qwen2", hidden_size=128, head_dim=16)["head_dim"] == 16
