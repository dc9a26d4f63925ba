"""Exact parameter counts of decoder-only language models, computed from ``config.json`` alone.

The count mirrors the module tree transformers builds for each family (embeddings, attention with
GQA / latent attention, gated MLP, MoE experts + shared experts + router, norms, untied lm_head),
so for the supported families it equals ``sum(p.numel() for p in model.parameters())`` exactly;
the unit tests check that against models instantiated on the meta device. *Active* parameters
count only ``experts_per_token`` routed experts per MoE layer (the router and shared experts run
for every token).

:class:`TextShape` is the normalised view of a text config; the vision tower lives in
``vision_params.py``. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.families import TEXT_DEFAULTS, FamilyTraits, traits


@dataclass(frozen=True)
class TextShape:
    """The numbers of a text config the count (and the layout planner) need, defaults filled in."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    context_length: int | None
    tie_word_embeddings: bool
    num_experts: int
    experts_per_token: int
    raw: dict[str, Any]

    def get(self, key: str) -> Any:
        """A config value with the family default applied (None if neither is known)."""
        if key in self.raw:
            return self.raw[key]
        return TEXT_DEFAULTS.get(self.family, {}).get(key)


_NULLABLE = frozenset({"q_lora_rank", "head_dim"})


def _require_int(config: dict[str, Any], key: str, source: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelError(
            f"{source}: config.json has {key}={value!r}; a positive integer is required to describe the model. "
            "Pass a complete Hugging Face model directory (config.json as written by save_pretrained)."
        )
    return value


def _num_experts(config: dict[str, Any], family_traits: FamilyTraits) -> int:
    if not family_traits.is_moe:
        return 0
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 0


def text_shape(family: str, config: dict[str, Any], source: str = "config.json") -> TextShape:
    """Normalise a text config dict of ``family`` into a :class:`TextShape`.

    Raises :class:`ModelError` naming ``source`` when a required size is missing.
    """
    defaults = TEXT_DEFAULTS.get(family, {})
    # An explicit null keeps its meaning only where null is meaningful (e.g. no q low-rank projection).
    merged = {**defaults, **{k: v for k, v in config.items() if v is not None or k in _NULLABLE}}
    hidden = _require_int(merged, "hidden_size", source)
    heads = _require_int(merged, "num_attention_heads", source)
    kv_heads = merged.get("num_key_value_heads") or heads
    family_traits = traits(family)
    head_dim = merged.get("head_dim") or hidden // heads
    if family_traits.attention == "mla":  # the q/k head: a no-rope part and a rope part
        head_dim = int(merged.get("qk_nope_head_dim") or 0) + int(merged.get("qk_rope_head_dim") or 0) or head_dim
    num_experts = _num_experts(merged, family_traits)
    top_k = int(merged.get("num_experts_per_tok") or 0) if num_experts else 0
    context = merged.get("max_position_embeddings")
    return TextShape(
        family=family,
        vocab_size=_require_int(merged, "vocab_size", source),
        hidden_size=hidden,
        num_layers=_require_int(merged, "num_hidden_layers", source),
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(merged.get("intermediate_size") or 0),
        context_length=int(context) if isinstance(context, int) else None,
        tie_word_embeddings=bool(merged.get("tie_word_embeddings", False)),
        num_experts=num_experts,
        experts_per_token=top_k,
        raw=merged,
    )


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _attention_params(shape: TextShape, family_traits: FamilyTraits) -> int:
    h = shape.hidden_size
    if family_traits.attention == "mla":
        return _mla_params(shape)
    bias = bool(shape.get("attention_bias"))
    qkv_bias = bias if family_traits.qkv_bias is None else family_traits.qkv_bias
    o_bias = bias if family_traits.o_bias is None else family_traits.o_bias
    q_out = shape.num_attention_heads * shape.head_dim
    kv_out = shape.num_kv_heads * shape.head_dim
    total = _linear(h, q_out, qkv_bias) + 2 * _linear(h, kv_out, qkv_bias) + _linear(q_out, h, o_bias)
    if family_traits.qk_norm:
        total += 2 * shape.head_dim
    return total


def _mla_params(shape: TextShape) -> int:
    """DeepSeek multi-head latent attention (low-rank q and compressed kv with a rope part)."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    bias = bool(shape.get("attention_bias"))
    nope, rope = int(shape.get("qk_nope_head_dim")), int(shape.get("qk_rope_head_dim"))
    v_dim, kv_rank = int(shape.get("v_head_dim")), int(shape.get("kv_lora_rank"))
    q_rank = shape.get("q_lora_rank")
    qk_dim = nope + rope
    if q_rank:
        q = _linear(h, q_rank, bias) + q_rank + _linear(q_rank, heads * qk_dim, False)
    else:
        q = _linear(h, heads * qk_dim, False)
    kv = _linear(h, kv_rank + rope, bias) + kv_rank + _linear(kv_rank, heads * (nope + v_dim), False)
    return q + kv + _linear(heads * v_dim, h, bias)


def _gated_mlp(hidden: int, intermediate: int, bias: bool = False) -> int:
    return 2 * _linear(hidden, intermediate, bias) + _linear(intermediate, hidden, bias)


def _is_sparse_layer(shape: TextShape, layer: int, moe: str) -> bool:
    if shape.num_experts <= 0:
        return False
    if moe == "qwen":
        step = int(shape.get("decoder_sparse_step") or 1)
        return layer not in (shape.get("mlp_only_layers") or []) and (layer + 1) % step == 0
    if moe == "deepseek":
        return layer >= int(shape.get("first_k_dense_replace") or 0)
    return True


def _moe_layer_params(shape: TextShape, moe: str, experts: int) -> int:
    """Router + ``experts`` routed experts + shared experts of one sparse layer."""
    h = shape.hidden_size
    expert_size = shape.intermediate_size if moe == "mixtral" else int(shape.get("moe_intermediate_size"))
    total = h * shape.num_experts + experts * _gated_mlp(h, expert_size)
    if moe == "qwen":
        shared = int(shape.get("shared_expert_intermediate_size") or 0)
        if shared:
            total += _gated_mlp(h, shared) + h  # shared expert + its sigmoid gate
    elif moe == "deepseek":
        shared = int(shape.get("n_shared_experts") or 0)
        if shared:
            total += _gated_mlp(h, shared * expert_size)
    return total


def count_text_parameters(shape: TextShape) -> tuple[int, int]:
    """``(total, active)`` parameters of the language model described by ``shape``."""
    family_traits = traits(shape.family)
    h = shape.hidden_size
    per_layer_fixed = _attention_params(shape, family_traits) + family_traits.norms_per_layer * h
    dense_mlp = _gated_mlp(h, shape.intermediate_size, bool(shape.get("mlp_bias")))
    total = active = 0
    for layer in range(shape.num_layers):
        total += per_layer_fixed
        active += per_layer_fixed
        if family_traits.moe and _is_sparse_layer(shape, layer, family_traits.moe):
            total += _moe_layer_params(shape, family_traits.moe, shape.num_experts)
            active += _moe_layer_params(shape, family_traits.moe, min(shape.experts_per_token, shape.num_experts))
        else:
            total += dense_mlp
            active += dense_mlp
    outer = shape.vocab_size * h + h  # embeddings + final norm
    if not shape.tie_word_embeddings:
        outer += shape.vocab_size * h
    return total + outer, active + outer
