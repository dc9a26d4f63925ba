"""Names between Hugging Face checkpoints and the archon decoder, both ways, exactly.

Archon names drop HF's ``model.`` prefix (``embed_tokens.weight``, ``layers.3.self_attn.q_proj.weight``,
``norm.weight``, ``lm_head.weight``) and hold each MoE layer's routed experts stacked
(``layers.i.mlp.experts.{gate,up,down}_proj`` of shape ``[E, I, H]`` / ``[E, H, I]``). Checkpoints on
disk name every expert separately (transformers fuses them only in memory):
``model.layers.i.mlp.experts.{e}.{gate,up,down}_proj.weight`` for qwen2_moe/qwen3_moe and
``model.layers.i.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`` for mixtral, whose router is
``block_sparse_moe.gate`` (archon: ``mlp.gate``). The critic's value head is HF's token
classification head ``score`` (archon: ``value_head``). With tied embeddings HF saves no
``lm_head.weight``, so neither does :func:`archon_to_hf`.

:func:`hf_to_archon` converts a whole state dict (loading); :func:`archon_to_hf` one tensor at a
time (export and weight updates stream tensor by tensor); :func:`hf_names` lists the HF names of a
model, layer by layer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import torch

from areal_tasks.engine.archon.model.args import ArchonArgs
from areal_tasks.errors import ModelError

logger = logging.getLogger(__name__)

_EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")
_MIXTRAL_PROJ = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_MIXTRAL_PROJ_BACK = {v: k for k, v in _MIXTRAL_PROJ.items()}
_TOP_LEVEL = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "score.weight": "value_head.weight",
    "score.bias": "value_head.bias",
}
_TOP_LEVEL_BACK = {v: k for k, v in _TOP_LEVEL.items()}
_HF_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_ARCHON_EXPERTS = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate_proj|up_proj|down_proj)$")
#: buffers some older checkpoints saved; the decoder computes them itself
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def _mlp_prefix(args: ArchonArgs) -> str:
    return "block_sparse_moe" if args.model_type == "mixtral" else "mlp"


def hf_to_archon(hf_state: Mapping[str, torch.Tensor], args: ArchonArgs) -> dict[str, torch.Tensor]:
    """A whole HF state dict (on-disk names) as archon FQNs, per-expert weights stacked."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, tensor in hf_state.items():
        if name in _TOP_LEVEL:
            out[_TOP_LEVEL[name]] = tensor
        elif m := _HF_EXPERT.match(name):
            layer, expert, proj = int(m[1]), int(m[2]), m[3]
            proj = _MIXTRAL_PROJ_BACK.get(proj, proj) if args.model_type == "mixtral" else proj
            if proj not in _EXPERT_PROJS:
                raise ModelError(f"unexpected expert weight {name!r} in a {args.model_type} checkpoint")
            experts.setdefault((layer, proj), {})[expert] = tensor
        elif m := _HF_LAYER.match(name):
            rest = m[2]
            if rest.startswith("block_sparse_moe.gate."):
                rest = "mlp.gate." + rest.removeprefix("block_sparse_moe.gate.")
            out[f"layers.{m[1]}.{rest}"] = tensor
        elif _IGNORED.search(name):
            continue
        else:
            raise ModelError(f"no archon name for {name!r} ({args.model_type} checkpoint)")
    for (layer, proj), by_index in sorted(experts.items()):
        if sorted(by_index) != list(range(args.n_experts)):
            raise ModelError(
                f"layer {layer} {proj}: the checkpoint holds experts {sorted(by_index)}, "
                f"expected 0..{args.n_experts - 1}"
            )
        out[f"layers.{layer}.mlp.experts.{proj}"] = torch.stack([by_index[e] for e in range(args.n_experts)])
    return out


def archon_to_hf(
    name: str, tensor: torch.Tensor, args: ArchonArgs, *, expert_offset: int = 0
) -> list[tuple[str, torch.Tensor]]:
    """The HF (on-disk) names and tensors of one archon tensor; stacked experts come back one per
    expert, numbered from ``expert_offset`` (an expert-parallel rank's first expert)."""
    if name in _TOP_LEVEL_BACK:
        if name == "lm_head.weight" and args.tie_word_embeddings:
            return []  # HF saves the tied head as the embedding only
        return [(_TOP_LEVEL_BACK[name], tensor)]
    if m := _ARCHON_EXPERTS.match(name):
        layer, proj = m[1], m[2]
        hf_proj = _MIXTRAL_PROJ[proj] if args.model_type == "mixtral" else proj
        prefix = f"model.layers.{layer}.{_mlp_prefix(args)}.experts"
        return [(f"{prefix}.{expert_offset + e}.{hf_proj}.weight", tensor[e]) for e in range(tensor.shape[0])]
    if name.startswith("layers."):
        _, layer, rest = name.split(".", 2)
        if args.model_type == "mixtral" and rest.startswith("mlp.gate."):
            rest = "block_sparse_moe.gate." + rest.removeprefix("mlp.gate.")
        return [(f"model.layers.{layer}.{rest}", tensor)]
    raise ModelError(f"no HF name for archon tensor {name!r}")


def _attention_names(args: ArchonArgs) -> list[str]:
    names = []
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        names.append(f"self_attn.{proj}.weight")
        if args.o_bias if proj == "o_proj" else args.qkv_bias:
            names.append(f"self_attn.{proj}.bias")
    if args.qk_norm:
        names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    return names


def _mlp_names(args: ArchonArgs, layer: int) -> list[str]:
    if not args.is_moe_layer(layer):
        return [f"mlp.{proj}.weight" for proj in _EXPERT_PROJS]
    prefix = _mlp_prefix(args)
    projs = [_MIXTRAL_PROJ[p] for p in ("gate_proj", "down_proj", "up_proj")] if prefix != "mlp" else _EXPERT_PROJS
    experts = [f"{prefix}.experts.{e}.{p}.weight" for e in range(args.n_experts) for p in projs]
    gate = [f"{prefix}.gate.weight"]
    names = experts + gate if args.model_type == "qwen3_moe" else gate + experts
    if args.shared_expert_intermediate_size:
        names += [f"mlp.shared_expert.{p}.weight" for p in _EXPERT_PROJS] + ["mlp.shared_expert_gate.weight"]
    return names


def hf_names(args: ArchonArgs, *, role: str = "actor") -> list[str]:
    """Every HF (on-disk) tensor name of the model: the embedding, layer by layer (attention, MLP,
    norms; experts one by one), the final norm, the head (none when tied; ``score`` for a critic)."""
    names = ["model.embed_tokens.weight"]
    for i in range(args.n_layers):
        layer = [
            *_attention_names(args),
            *_mlp_names(args, i),
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        ]
        names += [f"model.layers.{i}.{n}" for n in layer]
    names.append("model.norm.weight")
    if role == "critic":
        names += ["score.weight", "score.bias"]
    elif not args.tie_word_embeddings:
        names.append("lm_head.weight")
    return names
