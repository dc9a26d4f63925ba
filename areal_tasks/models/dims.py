"""``ModelDims``: the one description of a decoder's architecture, and its exact parameter counts.

:meth:`ModelDims.from_config` reads a ``config.json`` dict (or a transformers config object), takes
the language-model part of a vision-language config, fills in the keys a saved config may omit with
the family's defaults (:data:`~areal_tasks.models.families.TEXT_DEFAULTS`) and resolves what the
family fixes (biases, q/k norms, sandwich norms, the MoE and latent-attention layouts). Everything
that needs a model's sizes reads this one type: detection (:class:`~areal_tasks.models.info.ModelInfo`
holds one), the layout recommendation and the memory estimate (:mod:`areal_tasks.models.memory`).

The counts mirror the module tree transformers builds for each family (embeddings, attention with
GQA or DeepSeek's latent attention, gated MLP, MoE experts + shared experts + router, norms, untied
lm_head), so for the supported families :attr:`ModelDims.num_params` equals
``sum(p.numel() for p in model.parameters())`` exactly; unit tests check that against models
instantiated on the meta device. *Active* parameters count only ``experts_per_token`` routed
experts per MoE layer (the router and shared experts run for every token). Unknown families are
counted as llama-style dense decoders. The vision tower lives in ``vision_params.py``. Torch-free.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.families import TEXT_DEFAULTS, UNKNOWN, family_from_config, traits

logger = logging.getLogger(__name__)

__all__ = ["ModelDims", "text_config"]

#: keys whose explicit null keeps its meaning (e.g. no low-rank q projection) instead of the default.
_NULLABLE = frozenset({"q_lora_rank", "head_dim"})
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a decoder-only language model (the text part of a VL model), defaults filled in.

    ``head_dim`` is the q/k head size (latent attention: its no-rope plus rope parts).
    ``moe_intermediate_size`` is one routed expert's MLP width and ``shared_expert_intermediate_size``
    that of all shared experts together; ``num_moe_layers`` of the ``num_layers`` are sparse.
    ``q_lora_rank`` (0 = a full q projection), ``kv_lora_rank``, ``qk_rope_head_dim`` and
    ``v_head_dim`` describe latent attention (``attention == "mla"``).
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    context_length: int | None = None
    tie_word_embeddings: bool = False
    attention: str = "mha"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    mlp_bias: bool = False
    norms_per_layer: int = 2
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    num_moe_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(cls, config: Any, source: str = "config.json") -> ModelDims:
        """Read a ``config.json`` dict or a transformers ``PretrainedConfig`` (its text part for a
        vision-language model). Raises :class:`ModelError` naming ``source`` when a size every
        decoder has is missing or not a positive integer."""
        data = _as_dict(config, source)
        text = text_config(data)
        return cls.from_text_config(text_family(data, text), text, source)

    @classmethod
    def from_text_config(cls, family: str, config: dict[str, Any], source: str = "config.json") -> ModelDims:
        """The dims of a text config dict of ``family`` (a family name, ``unknown`` = llama-style)."""
        defaults = TEXT_DEFAULTS.get(family, {})
        merged = {**defaults, **{k: v for k, v in config.items() if v is not None or k in _NULLABLE}}
        _require_sizes(merged, source)
        fam = traits(family)
        hidden, heads = int(merged["hidden_size"]), int(merged["num_attention_heads"])
        head_dim = int(merged.get("head_dim") or hidden // heads)
        rope = nope = 0
        if fam.attention == "mla":  # the q/k head: a no-rope part and a rope part
            rope, nope = int(merged.get("qk_rope_head_dim") or 0), int(merged.get("qk_nope_head_dim") or 0)
            head_dim = nope + rope or head_dim
        bias = bool(merged.get("attention_bias"))
        num_layers = int(merged["num_hidden_layers"])
        experts = _num_experts(merged) if fam.is_moe else 0
        expert_size = shared = 0
        if experts:
            expert_size = int(merged.get("intermediate_size") or 0)
            if fam.moe != "mixtral":
                expert_size = int(merged.get("moe_intermediate_size") or 0)
            if fam.moe == "qwen":
                shared = int(merged.get("shared_expert_intermediate_size") or 0)
            elif fam.moe == "deepseek":
                shared = int(merged.get("n_shared_experts") or 0) * expert_size
        context = merged.get("max_position_embeddings")
        return cls(
            family=family,
            vocab_size=int(merged["vocab_size"]),
            hidden_size=hidden,
            num_layers=num_layers,
            num_attention_heads=heads,
            num_kv_heads=int(merged.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(merged.get("intermediate_size") or 0),
            context_length=int(context) if isinstance(context, int) else None,
            tie_word_embeddings=bool(merged.get("tie_word_embeddings", False)),
            attention=fam.attention,
            qkv_bias=bias if fam.qkv_bias is None else fam.qkv_bias,
            o_bias=bias if fam.o_bias is None else fam.o_bias,
            qk_norm=fam.qk_norm,
            mlp_bias=bool(merged.get("mlp_bias")),
            norms_per_layer=fam.norms_per_layer,
            num_experts=experts,
            experts_per_token=int(merged.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=expert_size,
            shared_expert_intermediate_size=shared,
            shared_expert_gate=fam.moe == "qwen" and shared > 0,
            num_moe_layers=sum(_is_sparse_layer(merged, i, fam.moe) for i in range(num_layers)) if experts else 0,
            q_lora_rank=int(merged.get("q_lora_rank") or 0) if fam.attention == "mla" else 0,
            kv_lora_rank=int(merged.get("kv_lora_rank") or 0) if fam.attention == "mla" else 0,
            qk_rope_head_dim=rope,
            v_head_dim=int(merged.get("v_head_dim") or 0) if fam.attention == "mla" else 0,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ shape facts

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def linears(self, moe: bool) -> list[tuple[int, int]]:
        """``(in, out)`` of every linear layer of one decoder layer (a MoE one when ``moe``)."""
        attention = self._attention_linears()
        if not moe:
            return attention + _swiglu(self.hidden_size, self.intermediate_size)
        h = self.hidden_size
        mlp = _swiglu(h, self.moe_intermediate_size) * self.num_experts + [(h, self.num_experts)]
        if self.shared_expert_intermediate_size:
            mlp += _swiglu(h, self.shared_expert_intermediate_size)
            if self.shared_expert_gate:
                mlp.append((h, 1))
        return attention + mlp

    def _attention_linears(self) -> list[tuple[int, int]]:
        h, a = self.hidden_size, self.num_attention_heads
        if self.attention == "mla":
            nope = self.head_dim - self.qk_rope_head_dim
            q = [(h, self.q_lora_rank), (self.q_lora_rank, a * self.head_dim)] if self.q_lora_rank else []
            q = q or [(h, a * self.head_dim)]
            kv = [(h, self.kv_lora_rank + self.qk_rope_head_dim), (self.kv_lora_rank, a * (nope + self.v_head_dim))]
            return q + kv + [(a * self.v_head_dim, h)]
        d, g = self.head_dim, self.num_kv_heads
        return [(h, a * d), (h, g * d), (h, g * d), (a * d, h)]

    # ------------------------------------------------------------------ parameter counts

    def attention_params(self) -> int:
        """Parameters of one layer's attention: projections, their biases, latent or q/k norms."""
        weights = sum(i * o for i, o in self._attention_linears())
        h, a, g, d = self.hidden_size, self.num_attention_heads, self.num_kv_heads, self.head_dim
        if self.attention == "mla":
            # biases on the down-projections (q's only when it is low-rank) and o; RMSNorms on the
            # compressed q and kv
            down = self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim
            biases = (down if self.qkv_bias else 0) + (h if self.o_bias else 0)
            return weights + biases + self.q_lora_rank + self.kv_lora_rank
        biases = ((a + 2 * g) * d if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return weights + biases + (2 * d if self.qk_norm else 0)

    def mlp_params(self, moe: bool, experts: int | None = None) -> int:
        """Parameters of one layer's MLP; a MoE one counts ``experts`` routed experts (default: all)."""
        h = self.hidden_size
        if not moe:
            bias = (2 * self.intermediate_size + h) if self.mlp_bias else 0
            return 3 * h * self.intermediate_size + bias
        routed = self.num_experts if experts is None else min(experts, self.num_experts)
        total = h * self.num_experts + routed * 3 * h * self.moe_intermediate_size
        if self.shared_expert_intermediate_size:
            total += 3 * h * self.shared_expert_intermediate_size + (h if self.shared_expert_gate else 0)
        return total

    def layer_params(self, moe: bool) -> int:
        """Parameters of one decoder layer (attention, MLP, norms)."""
        return self.attention_params() + self.mlp_params(moe) + self.norms_per_layer * self.hidden_size

    @property
    def root_params(self) -> int:
        """Embedding, lm_head (unless tied) and final norm."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    @property
    def num_params(self) -> int:
        """Every parameter of the language model."""
        sparse = self.num_moe_layers * self.layer_params(True) if self.num_moe_layers else 0
        return self.num_dense_layers * self.layer_params(False) + sparse + self.root_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token runs through: ``experts_per_token`` routed experts per MoE layer."""
        if not self.num_moe_layers:
            return self.num_params
        inactive = self.mlp_params(True) - self.mlp_params(True, self.experts_per_token)
        return self.num_params - self.num_moe_layers * inactive

    @property
    def routed_expert_params(self) -> int:
        """Parameters in routed experts, all layers (what expert parallelism splits)."""
        return self.num_moe_layers * self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    def lora_params(self, rank: int) -> int:
        """LoRA parameters of rank ``rank`` on every linear of every decoder layer."""
        per = {flag: rank * sum(i + o for i, o in self.linears(flag)) for flag in (False, True)}
        return self.num_dense_layers * per[False] + (self.num_moe_layers * per[True] if self.num_moe_layers else 0)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of ``config``: ``text_config`` when nested, else the top level."""
    nested = config.get("text_config")
    if not isinstance(nested, dict):
        return config
    text = dict(nested)
    for key in ("tie_word_embeddings", "vocab_size", "torch_dtype", "dtype"):
        if key not in text and key in config:
            text[key] = config[key]
    return text


def text_family(config: dict[str, Any], text: dict[str, Any]) -> str:
    """The family whose text config ``text`` is (``text`` = ``config`` for a text-only model)."""
    family = family_from_config(config)
    if text is config:
        return family
    nested_family = family_from_config(text)
    if nested_family != UNKNOWN and not traits(nested_family).is_vision_language:
        return nested_family
    return traits(family).text_type or family


def _as_dict(config: Any, source: str) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise ModelError(f"{source}: expected a config.json mapping or a transformers config, got {type(config).__name__}")


def _require_sizes(config: dict[str, Any], source: str) -> None:
    missing = [key for key in _REQUIRED if config.get(key) is None]
    if missing:
        raise ModelError(
            f"{source}: config.json lacks {missing}, sizes every decoder has. "
            "Pass a complete Hugging Face model directory (config.json as written by save_pretrained)."
        )
    for key in _REQUIRED:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelError(
                f"{source}: config.json has {key}={value!r}; a positive integer is required to describe the model. "
                "Pass a complete Hugging Face model directory (config.json as written by save_pretrained)."
            )


def _num_experts(config: dict[str, Any]) -> int:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 0


def _is_sparse_layer(config: dict[str, Any], layer: int, moe: str | None) -> bool:
    if moe == "qwen":
        step = int(config.get("decoder_sparse_step") or 1)
        return layer not in (config.get("mlp_only_layers") or []) and (layer + 1) % step == 0
    if moe == "deepseek":
        return layer >= int(config.get("first_k_dense_replace") or 0)
    return True


def _swiglu(h: int, inner: int) -> list[tuple[int, int]]:
    return [(h, inner), (h, inner), (inner, h)]
