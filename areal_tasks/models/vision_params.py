"""Parameter counts of the vision towers (and projectors) of vision-language models.

Supported towers: Qwen2-VL, Qwen2.5-VL, CLIP (LLaVA) and SigLIP (Gemma3, LLaVA variants). Each count
mirrors the transformers module tree, including the projector that maps vision features into the
language model; tests check them against meta-device models. A tower that is not recognised is
reported (``None``) rather than guessed, and the caller records a warning. Torch-free.
"""

from __future__ import annotations

from typing import Any


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _layer_norm(dim: int) -> int:
    return 2 * dim


def _qwen_merger(dim: int, out_dim: int, merge: int, ln: int) -> int:
    merged = dim * merge * merge
    return ln + _linear(merged, merged) + _linear(merged, out_dim)


def _qwen2_vl(vision: dict[str, Any], text_hidden: int) -> int:
    dim = int(vision.get("embed_dim", 1280))
    depth = int(vision.get("depth", 32))
    mlp = int(dim * float(vision.get("mlp_ratio", 4)))
    channels = int(vision.get("in_channels", vision.get("in_chans", 3)))
    patch = int(vision.get("patch_size", 14))
    temporal = int(vision.get("temporal_patch_size", 2))
    out_dim = int(vision.get("hidden_size", text_hidden))
    block = 2 * _layer_norm(dim) + _linear(dim, 3 * dim) + _linear(dim, dim) + _linear(dim, mlp) + _linear(mlp, dim)
    patch_embed = channels * temporal * patch * patch * dim
    merge = int(vision.get("spatial_merge_size", 2))
    return patch_embed + depth * block + _qwen_merger(dim, out_dim, merge, _layer_norm(dim))


def _qwen2_5_vl(vision: dict[str, Any], text_hidden: int) -> int:
    dim = int(vision.get("hidden_size", 1280))
    depth = int(vision.get("depth", 32))
    mlp = int(vision.get("intermediate_size", 3420))
    channels = int(vision.get("in_channels", vision.get("in_chans", 3)))
    patch = int(vision.get("patch_size", 14))
    temporal = int(vision.get("temporal_patch_size", 2))
    out_dim = int(vision.get("out_hidden_size", text_hidden))
    # RMSNorms (weight only) and a gated MLP with biases
    block = 2 * dim + _linear(dim, 3 * dim) + _linear(dim, dim) + 2 * _linear(dim, mlp) + _linear(mlp, dim)
    patch_embed = channels * temporal * patch * patch * dim
    merge = int(vision.get("spatial_merge_size", 2))
    return patch_embed + depth * block + _qwen_merger(dim, out_dim, merge, dim)


def _vit_encoder(vision: dict[str, Any]) -> tuple[int, int, int]:
    """``(dim, mlp, encoder_params)`` of a CLIP/SigLIP pre-norm transformer encoder."""
    dim = int(vision.get("hidden_size", 768))
    mlp = int(vision.get("intermediate_size", 3072))
    layers = int(vision.get("num_hidden_layers", 12))
    layer = 4 * _linear(dim, dim) + 2 * _layer_norm(dim) + _linear(dim, mlp) + _linear(mlp, dim)
    return dim, mlp, layers * layer


def _clip(vision: dict[str, Any]) -> int:
    dim, _, encoder = _vit_encoder(vision)
    channels = int(vision.get("num_channels", 3))
    patch = int(vision.get("patch_size", 32))
    positions = (int(vision.get("image_size", 224)) // patch) ** 2 + 1
    embeddings = dim + channels * patch * patch * dim + positions * dim
    return embeddings + _layer_norm(dim) + encoder + _layer_norm(dim)


def _siglip(vision: dict[str, Any]) -> int:
    dim, mlp, encoder = _vit_encoder(vision)
    channels = int(vision.get("num_channels", 3))
    patch = int(vision.get("patch_size", 16))
    positions = (int(vision.get("image_size", 224)) // patch) ** 2
    embeddings = _linear(channels * patch * patch, dim) + positions * dim
    total = embeddings + encoder + _layer_norm(dim)
    if vision.get("vision_use_head", True):
        attention_pool = dim + _linear(dim, 3 * dim) + _linear(dim, dim)
        total += attention_pool + _layer_norm(dim) + _linear(dim, mlp) + _linear(mlp, dim)
    return total


def _tower_kind(family: str, vision: dict[str, Any]) -> str | None:
    model_type = str(vision.get("model_type") or "")
    if model_type.startswith("siglip"):
        return "siglip"
    if model_type.startswith("clip"):
        return "clip"
    if family in ("qwen2_vl", "qwen2_5_vl"):
        return family
    if family == "gemma3":
        return "siglip"
    if family == "llava":
        return "clip"
    return None


def _feature_layers(config: dict[str, Any]) -> int:
    layer = config.get("vision_feature_layer", -2)
    return len(layer) if isinstance(layer, (list, tuple)) else 1


def vision_parameters(family: str, config: dict[str, Any], text_hidden: int) -> int | None:
    """Parameters of the vision tower plus projector of a VL model, or None if the tower is unknown.

    ``config`` is the whole top-level ``config.json`` (holding ``vision_config``).
    """
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    kind = _tower_kind(family, vision)
    if kind == "qwen2_vl":
        return _qwen2_vl(vision, text_hidden)
    if kind == "qwen2_5_vl":
        return _qwen2_5_vl(vision, text_hidden)
    if kind not in ("clip", "siglip"):
        return None
    tower = _clip(vision) if kind == "clip" else _siglip(vision)
    vision_dim = int(vision.get("hidden_size", 768))
    if family == "gemma3":
        # Gemma3MultiModalProjector: a bias-free projection matrix and an RMSNorm on the vision side
        return tower + vision_dim * text_hidden + vision_dim
    bias = bool(config.get("multimodal_projector_bias", True))
    in_dim = vision_dim * _feature_layers(config)
    return tower + _linear(in_dim, text_hidden, bias) + _linear(text_hidden, text_hidden, bias)
