"""Known model families: how to recognise them and the config defaults their parameter count needs.

A *family* is the name the rest of the system keys on (LoRA targets, layout rules, tiny models).
It is found from ``model_type`` first and, when that is missing or unknown, from the
``architectures`` list of ``config.json``. :data:`TEXT_DEFAULTS` holds, per family, the class
defaults of the transformers config for every key the parameter count reads, because a saved
``config.json`` may omit keys equal to their defaults; a unit test checks this table against the
installed transformers so the two cannot drift apart silently.

Torch-free and transformers-free: this module is imported by DAG-side pre-flight checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNKNOWN = "unknown"


@dataclass(frozen=True)
class FamilyTraits:
    """What the rest of the code needs to know about one family.

    ``attention``: ``"mha"`` (q/k/v/o projections, GQA aware) or ``"mla"`` (DeepSeek latent attention).
    ``qkv_bias``: ``True``/``False`` fixed by the architecture, or ``None`` to read ``attention_bias``.
    ``o_bias``: like ``qkv_bias`` for the output projection.
    ``qk_norm``: per-head RMSNorm on q and k (Qwen3, Gemma3).
    ``norms_per_layer``: 2 for llama-style blocks, 4 for Gemma2/3 sandwich norms.
    ``moe``: ``None`` for dense, else the MoE layout name (``"qwen"``, ``"mixtral"``, ``"deepseek"``).
    ``text_type``: for vision-language families, the text family their language model follows.
    ``vision_type``: for vision-language families, which vision tower counter applies.
    ``plain_lm_head``: the causal-LM forward is ``logits = lm_head(hidden_states)`` with nothing
    after (no soft-capping or scaling), so the FSDP engine can fuse the head with the log-probs in
    chunks (its ``PLAIN_HEAD_FAMILIES`` is read from this flag).
    """

    attention: str = "mha"
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    qk_norm: bool = False
    norms_per_layer: int = 2
    moe: str | None = None
    text_type: str | None = None
    vision_type: str | None = None
    plain_lm_head: bool = False

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def is_vision_language(self) -> bool:
        return self.text_type is not None


FAMILIES: dict[str, FamilyTraits] = {
    "llama": FamilyTraits(plain_lm_head=True),
    "mistral": FamilyTraits(qkv_bias=False, o_bias=False, plain_lm_head=True),
    "qwen2": FamilyTraits(qkv_bias=True, o_bias=False, plain_lm_head=True),
    "qwen3": FamilyTraits(qk_norm=True, plain_lm_head=True),
    "gemma": FamilyTraits(),
    "gemma2": FamilyTraits(norms_per_layer=4),
    "gemma3": FamilyTraits(qk_norm=True, norms_per_layer=4),
    "qwen2_moe": FamilyTraits(qkv_bias=True, o_bias=False, moe="qwen", plain_lm_head=True),
    "qwen3_moe": FamilyTraits(qk_norm=True, moe="qwen", plain_lm_head=True),
    "mixtral": FamilyTraits(qkv_bias=False, o_bias=False, moe="mixtral"),
    "deepseek_v2": FamilyTraits(attention="mla", moe="deepseek"),
    "deepseek_v3": FamilyTraits(attention="mla", moe="deepseek"),
    "qwen2_vl": FamilyTraits(
        qkv_bias=True, o_bias=False, text_type="qwen2", vision_type="qwen2_vl", plain_lm_head=True
    ),
    "qwen2_5_vl": FamilyTraits(
        qkv_bias=True, o_bias=False, text_type="qwen2", vision_type="qwen2_5_vl", plain_lm_head=True
    ),
    "llava": FamilyTraits(text_type="llama", vision_type="clip"),
}

#: ``model_type`` values (of the top-level config) that map to a family of another name.
_MODEL_TYPE_ALIASES: dict[str, str] = {"gemma3_text": "gemma3"}

#: ``architectures[0]`` prefixes, for configs without (or with an unknown) ``model_type``.
_ARCHITECTURE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("Qwen2_5_VL", "qwen2_5_vl"),
    ("Qwen2VL", "qwen2_vl"),
    ("Qwen2Moe", "qwen2_moe"),
    ("Qwen3Moe", "qwen3_moe"),
    ("Qwen2", "qwen2"),
    ("Qwen3", "qwen3"),
    ("Llava", "llava"),
    ("Llama", "llama"),
    ("Mixtral", "mixtral"),
    ("Mistral", "mistral"),
    ("Gemma3", "gemma3"),
    ("Gemma2", "gemma2"),
    ("Gemma", "gemma"),
    ("DeepseekV3", "deepseek_v3"),
    ("DeepseekV2", "deepseek_v2"),
)

#: transformers ``model_type`` of each family's *text* config (the key used by ``AutoConfig.for_model``).
TEXT_MODEL_TYPE: dict[str, str] = {name: name for name in FAMILIES}
TEXT_MODEL_TYPE["gemma3"] = "gemma3_text"

# Per-family class defaults of the transformers text config, for the keys the counter reads.
# ``head_dim`` None means hidden_size // num_attention_heads (DeepSeek's latent attention has its own
# head sizes, so it has no head_dim default). Checked against transformers in tests.
_COMMON: dict[str, Any] = {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "head_dim": None}
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "head_dim": None, "max_position_embeddings": 2048},
    "mistral": {**_COMMON, "max_position_embeddings": 131072},
    "qwen2": {**_COMMON, "max_position_embeddings": 32768},
    "qwen3": {**_COMMON, "head_dim": 128, "max_position_embeddings": 32768},
    "gemma": {**_COMMON, "tie_word_embeddings": True, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma2": {**_COMMON, "tie_word_embeddings": True, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma3": {**_COMMON, "tie_word_embeddings": True, "head_dim": 256, "max_position_embeddings": 131072},
    "qwen2_moe": {
        **_COMMON,
        "max_position_embeddings": 32768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
    },
    "qwen3_moe": {
        **_COMMON,
        "max_position_embeddings": 32768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
    },
    "mixtral": {**_COMMON, "max_position_embeddings": 131072},
    "deepseek_v2": {
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "max_position_embeddings": 2048,
        "moe_intermediate_size": 1407,
        "first_k_dense_replace": 0,
        "n_shared_experts": 2,
        "q_lora_rank": 1536,
    },
    "deepseek_v3": {
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "max_position_embeddings": 4096,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        "n_shared_experts": 1,
        "q_lora_rank": 1536,
    },
}


def family_from_config(config: dict[str, Any]) -> str:
    """Family name for a parsed ``config.json``, or :data:`UNKNOWN`."""
    model_type = str(config.get("model_type") or "")
    model_type = _MODEL_TYPE_ALIASES.get(model_type, model_type)
    if model_type in FAMILIES:
        return model_type
    for architecture in config.get("architectures") or ():
        for prefix, family in _ARCHITECTURE_PREFIXES:
            if str(architecture).startswith(prefix):
                return family
    return UNKNOWN


def canonical_family(name: str) -> str:
    """The family for a family name or a transformers ``model_type`` (``gemma3_text`` -> ``gemma3``)."""
    return _MODEL_TYPE_ALIASES.get(name, name)


def traits(family: str) -> FamilyTraits:
    """Traits of ``family``; unknown families are treated as llama-style dense models."""
    return FAMILIES.get(family, FamilyTraits())
