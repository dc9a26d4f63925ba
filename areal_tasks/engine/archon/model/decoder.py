"""ArchonDecoder: a plain-PyTorch decoder-only transformer over packed sequences.

One module tree for llama, qwen2, qwen3, mistral, qwen2_moe, qwen3_moe and mixtral, with transformers'
module names (so the name map and the tensor-parallel plans stay obvious). Layers live in an
``nn.ModuleDict`` keyed ``"0".."L-1"``: a pipeline stage deletes the keys it does not own and keeps
global names, and sets ``embed_tokens``/``norm``/``lm_head``/``value_head`` to None where another
stage holds them. The forward contract:

* input: token ids ``[1, T]`` when ``embed_tokens`` is present, else hidden states ``[1, T, H]``;
  ``position_ids [1, T]`` per sequence, ``cu_seqlens [S + 1]`` int32 of the packed row (``bounds``:
  the same on the host, sparing a device read);
* output: hidden ``[1, T, H]`` without a head; the actor with ``labels`` (the next-token labels)
  ``[1, T, 2]`` fp32 log-prob of the label at ``temperature`` and entropy (logits without labels);
  the critic ``[1, T, 1]`` fp32 values. Scores stay per position: aligning them to tokens
  (:func:`areal_tasks.kernels.logprobs.align_to_tokens`) is the engine's step.
* MoE models return ``(out, aux)``, ``aux [2, E]`` fp32 the running sums of the router statistics
  (see :mod:`moe`), so that a pipeline can carry them between stages.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from areal_tasks.engine.archon.model.args import ArchonArgs
from areal_tasks.engine.archon.model.attention import Attention
from areal_tasks.engine.archon.model.layers import FeedForward, RMSNorm, rope_cos_sin, rope_inv_freq
from areal_tasks.engine.archon.model.moe import MoE
from areal_tasks.errors import EngineError
from areal_tasks.kernels.logprobs import next_token_stats

logger = logging.getLogger(__name__)

ROLES: tuple[str, ...] = ("actor", "critic")


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h + attn(norm(h))``, then ``h + mlp(norm(h))`` (a dense MLP or an MoE block)."""

    def __init__(self, args: ArchonArgs, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(
            args.hidden_size,
            args.n_heads,
            args.n_kv_heads,
            args.head_dim,
            qkv_bias=args.qkv_bias,
            o_bias=args.o_bias,
            qk_norm=args.qk_norm,
            norm_eps=args.rms_norm_eps,
            sliding_window=args.layer_sliding_window(layer_id),
        )
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp: nn.Module
        if args.is_moe_layer(layer_id):
            self.mlp = MoE(
                args.hidden_size,
                args.n_experts,
                args.top_k,
                args.moe_intermediate_size,
                norm_topk_prob=args.norm_topk_prob,
                weights_fp32=args.model_type == "mixtral",
                shared_hidden=args.shared_expert_intermediate_size,
            )
        else:
            self.mlp = FeedForward(args.hidden_size, args.intermediate_size)

    def forward(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cu_seqlens: torch.Tensor,
        bounds: tuple[int, ...] | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(h [1, T, H], MoE statistics [2, E] or None)``."""
        h = h + self.self_attn(self.input_layernorm(h), rope, cu_seqlens, bounds)
        x = self.post_attention_layernorm(h)
        if isinstance(self.mlp, MoE):
            y, stats = self.mlp(x, token_mask)
            return h + y, stats
        return h + self.mlp(x), None


class ArchonDecoder(nn.Module):
    """The whole decoder (or, after a pipeline split, one stage of it); see the module docstring."""

    def __init__(self, args: ArchonArgs, *, role: str = "actor") -> None:
        super().__init__()
        if role not in ROLES:
            raise EngineError(f"unknown model role {role!r}; choose one of {', '.join(ROLES)}")
        self.args = args
        self.role = role
        self.embed_tokens: nn.Embedding | None = nn.Embedding(
            args.vocab_size, args.hidden_size, padding_idx=args.pad_token_id
        )
        self.layers = nn.ModuleDict({str(i): DecoderLayer(args, i) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head: nn.Linear | None = None
        self.value_head: nn.Linear | None = None
        if role == "critic":
            self.value_head = nn.Linear(args.hidden_size, 1)
        else:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share ``embed_tokens.weight`` with ``lm_head`` when the config ties them and this module
        holds both (call again after materialising from meta: ``to_empty`` unties them)."""
        if self.args.tie_word_embeddings and self.embed_tokens is not None and self.lm_head is not None:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        x: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        bounds: tuple[int, ...] | None = None,
        labels: torch.Tensor | None = None,
        temperature: float = 1.0,
        aux: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """See the module docstring; MoE models return ``(out, aux)``."""
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        if h.dim() != 3 or h.shape[0] != 1:
            raise EngineError(f"archon forward takes one packed row [1, T, ...]; got shape {tuple(h.shape)}")
        rope = rope_cos_sin(rope_inv_freq(self.args, h.device), position_ids, h.dtype)
        stats = None
        if self.args.is_moe:
            stats = aux if aux is not None else torch.zeros(2, self.args.n_experts, device=h.device)
        for layer in self.layers.values():
            h, layer_stats = layer(h, rope, cu_seqlens, bounds, token_mask)
            if layer_stats is not None:
                stats = layer_stats if stats is None else stats + layer_stats
        if self.norm is not None:
            h = self.norm(h)
        out = self._head(h, labels, temperature)
        return (out, stats) if stats is not None else out

    def _head(self, h: torch.Tensor, labels: torch.Tensor | None, temperature: float) -> torch.Tensor:
        if self.value_head is not None:
            return self.value_head(h).float()
        if self.lm_head is None:
            return h
        logits = self.lm_head(h)
        if labels is None:
            return logits
        logprob, entropy = next_token_stats(logits[0], labels.reshape(-1), temperature=temperature, with_entropy=True)
        assert entropy is not None
        # stacked from [1, T] rows: a fresh tensor, not a view (FSDP2 warns about module outputs that are views)
        return torch.stack([logprob.unsqueeze(0), entropy.unsqueeze(0)], dim=-1)
