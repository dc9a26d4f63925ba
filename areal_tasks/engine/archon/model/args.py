"""The archon decoder's hyper-parameters, read from a Hugging Face config.

:class:`ArchonArgs` is the one description of the architecture that the decoder, the name map, the
pipeline splitter and the parallel plans read: a frozen dataclass, built by :meth:`ArchonArgs.from_hf`
from a transformers config (or its ``config.json`` dict) of a supported family. Anything the plain
decoder would silently compute differently from transformers (another activation, an MLP bias, a
rope type it does not implement, router jitter) is refused here, by name, rather than trained wrong.

Torch-free: the pipeline's cost model reads the parameter counts without building a model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from areal_tasks.errors import EngineError

logger = logging.getLogger(__name__)

#: model_type values the archon decoder implements.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral")
MOE_MODEL_TYPES: frozenset[str] = frozenset({"qwen2_moe", "qwen3_moe", "mixtral"})
#: rope types the decoder computes itself (``default`` plus the two scalings of the llama family).
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ArchonArgs:
    """Architecture of one decoder-only model (dense or MoE); sizes as in the HF config."""

    model_type: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    #: the window of sliding-window attention (None = full attention everywhere) ...
    sliding_window: int | None = None
    #: ... and the layers it applies to (None = every layer)
    sliding_window_layers: tuple[int, ...] | None = None
    # MoE (n_experts == 0: dense)
    n_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.0

    @classmethod
    def from_hf(cls, hf_config: Any) -> ArchonArgs:
        """Args of a transformers config object or a ``config.json`` dict; EngineError if unsupported."""
        config = _as_config(hf_config)
        model_type = config.model_type
        get = config.__dict__.get
        if (act := get("hidden_act", "silu")) != "silu":
            raise EngineError(f"archon supports the silu (SwiGLU) MLP only; {model_type} config has hidden_act={act!r}")
        if get("mlp_bias", False):
            raise EngineError(f"archon does not support mlp_bias=True ({model_type})")
        if get("router_jitter_noise", 0.0):
            raise EngineError(
                f"archon does not support router_jitter_noise ({get('router_jitter_noise')}) ({model_type})"
            )
        n_heads = int(config.num_attention_heads)
        head_dim = int(get("head_dim") or config.hidden_size // n_heads)
        attention_bias = bool(get("attention_bias", False))
        qkv_bias = {"qwen2": True, "qwen2_moe": bool(get("qkv_bias", True)), "mistral": False, "mixtral": False}
        o_bias = {"qwen2": False, "qwen2_moe": False, "mistral": False, "mixtral": False}
        window, window_layers = _sliding_window(config)
        n_experts = int(get("num_experts") or get("num_local_experts") or 0) if model_type in MOE_MODEL_TYPES else 0
        moe: dict[str, Any] = {}
        if n_experts:
            mixtral = model_type == "mixtral"
            moe = {
                "n_experts": n_experts,
                "top_k": int(config.num_experts_per_tok),
                "moe_intermediate_size": int(config.intermediate_size if mixtral else config.moe_intermediate_size),
                "norm_topk_prob": True if mixtral else bool(get("norm_topk_prob", False)),
                "shared_expert_intermediate_size": int(get("shared_expert_intermediate_size") or 0)
                if model_type == "qwen2_moe"
                else 0,
                "decoder_sparse_step": int(get("decoder_sparse_step") or 1),
                "mlp_only_layers": tuple(int(i) for i in (get("mlp_only_layers") or ())),
                "router_aux_loss_coef": float(get("router_aux_loss_coef") or 0.0),
            }
        return cls(
            model_type=model_type,
            vocab_size=int(config.vocab_size),
            hidden_size=int(config.hidden_size),
            n_layers=int(config.num_hidden_layers),
            n_heads=n_heads,
            n_kv_heads=int(get("num_key_value_heads") or n_heads),
            head_dim=head_dim,
            intermediate_size=int(config.intermediate_size),
            rms_norm_eps=float(config.rms_norm_eps),
            **_rope(config),
            qkv_bias=qkv_bias.get(model_type, attention_bias),
            o_bias=o_bias.get(model_type, attention_bias),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            pad_token_id=get("pad_token_id"),
            sliding_window=window,
            sliding_window_layers=window_layers,
            **moe,
        )

    # -- structure ---------------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` has a routed MoE block (transformers' rule for qwen2_moe/qwen3_moe)."""
        if not self.is_moe or i in self.mlp_only_layers:
            return False
        return (i + 1) % self.decoder_sparse_step == 0

    @property
    def n_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.n_layers))

    def layer_sliding_window(self, i: int) -> int | None:
        """The attention window of layer ``i`` (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.sliding_window_layers is not None and i not in self.sliding_window_layers:
            return None
        return self.sliding_window

    # -- costs -------------------------------------------------------------------------------------

    def _attention_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.n_heads * d, self.n_kv_heads * d
        params = h * (q + 2 * kv) + q * h
        params += (q + 2 * kv) if self.qkv_bias else 0
        params += h if self.o_bias else 0
        params += 2 * d if self.qk_norm else 0
        return params

    def _mlp_params(self, i: int, *, active: bool) -> int:
        h = self.hidden_size
        if not self.is_moe_layer(i):
            return 3 * h * self.intermediate_size
        experts = self.top_k if active else self.n_experts
        params = experts * 3 * h * self.moe_intermediate_size + h * self.n_experts
        if self.shared_expert_intermediate_size:
            params += 3 * h * self.shared_expert_intermediate_size + h
        return params

    def layer_param_count(self, i: int) -> int:
        """Parameters of decoder layer ``i`` (every expert counted)."""
        return self._attention_params() + self._mlp_params(i, active=False) + 2 * self.hidden_size

    def layer_flops_per_token(self, i: int) -> float:
        """Forward matmul FLOPs per token of layer ``i`` (2 x the active weights: top-k experts only;
        the attention score term, which grows with the sequence length, is left out)."""
        return 2.0 * (self._attention_params() + self._mlp_params(i, active=True))

    @property
    def embed_param_count(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_param_count(self) -> int:
        """The final norm and the LM head (a stage that holds the head holds its own copy even when tied)."""
        return self.hidden_size + self.vocab_size * self.hidden_size


def _as_config(hf_config: Any) -> Any:
    """A transformers config object (a dict is completed with the family's defaults)."""
    model_type = (
        hf_config.get("model_type") if isinstance(hf_config, Mapping) else getattr(hf_config, "model_type", None)
    )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise EngineError(
            f"the archon engine does not support model_type {model_type!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (use the fsdp engine for other models)"
        )
    if not isinstance(hf_config, Mapping):
        return hf_config
    from transformers import AutoConfig

    kwargs = {k: v for k, v in hf_config.items() if k != "model_type"}
    return AutoConfig.for_model(model_type, **kwargs)


def _rope(config: Any) -> dict[str, Any]:
    params = dict(getattr(config, "rope_parameters", None) or {})
    if not params:  # an older config object: rope_theta and rope_scaling as attributes
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise EngineError(
            f"archon does not implement rope_type {rope_type!r} ({config.model_type}); "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise EngineError(f"archon does not support partial_rotary_factor ({config.model_type})")
    out: dict[str, Any] = {"rope_theta": float(params["rope_theta"]), "rope_type": rope_type}
    if rope_type in ("linear", "llama3"):
        out["rope_factor"] = float(params["factor"])
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = float(params["low_freq_factor"])
        out["rope_high_freq_factor"] = float(params["high_freq_factor"])
        out["rope_original_max_positions"] = int(params["original_max_position_embeddings"])
    return out


def _sliding_window(config: Any) -> tuple[int | None, tuple[int, ...] | None]:
    """The window and the layers using it, as transformers decides them per family."""
    window = getattr(config, "sliding_window", None) or None  # qwen2_moe writes 0 for "off"
    if window is None:
        return None, None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:  # mistral, mixtral, qwen3_moe: every layer
        return int(window), None
    layers = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    return (int(window), layers) if layers else (None, None)
