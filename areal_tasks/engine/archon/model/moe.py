"""The MoE block: router exactly as transformers routes per family, routed and shared experts, and the
load-balancing statistics that travel with the activations.

Routing (``gate`` is ``nn.Linear(H, E, bias=False)``): softmax of the router logits in fp32, top-k;
qwen2_moe/qwen3_moe renormalise the top-k probabilities when ``norm_topk_prob`` and cast the weights
back to the activations' dtype; mixtral always renormalises (softmax over the top-k logits) and keeps
the weights in fp32. qwen2_moe adds a shared expert scaled by ``sigmoid(shared_expert_gate(x))``.

Every MoE forward also returns this layer's statistics over the real tokens (``token_mask``): the
top-k assignment count per expert (not differentiable) and the summed router probability per expert
(differentiable). Summed over layers and micro-batch slices, :func:`moe_aux_loss` turns them into
transformers' ``load_balancing_loss_func``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from areal_tasks.engine.archon.model.experts import GroupedExperts, LocalDispatcher, experts_forward
from areal_tasks.engine.archon.model.layers import FeedForward

logger = logging.getLogger(__name__)

# the experts live in experts.py; the contract names them from here too
__all__ = ["GroupedExperts", "LocalDispatcher", "MoE", "experts_forward", "moe_aux_loss", "route"]


def route(
    logits: torch.Tensor, top_k: int, *, norm_topk_prob: bool, weights_fp32: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(probs fp32 [N, E], top_k_weight [N, k], top_k_index [N, k])`` of router ``logits [N, E]``."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weight, index = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weight = weight / weight.sum(dim=-1, keepdim=True)
    if not weights_fp32:
        weight = weight.to(logits.dtype)
    return probs, weight, index


class MoE(nn.Module):
    """Router + routed experts (+ qwen2_moe's gated shared expert) of one decoder layer."""

    def __init__(
        self,
        dim: int,
        n_experts: int,
        top_k: int,
        hidden: int,
        *,
        norm_topk_prob: bool,
        weights_fp32: bool = False,
        shared_hidden: int = 0,
    ) -> None:
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weights_fp32 = weights_fp32
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = GroupedExperts(n_experts, dim, hidden)
        self.shared_expert = FeedForward(dim, shared_hidden) if shared_hidden else None
        self.shared_expert_gate = nn.Linear(dim, 1, bias=False) if shared_hidden else None

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, E]`` router logits of ``x [..., H]``."""
        return self.gate(x.reshape(-1, x.shape[-1]))

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [..., H]`` -> ``(y [..., H], stats [2, E] fp32)``: row 0 the top-k counts, row 1 the
        summed router probabilities, both over the tokens where ``token_mask`` is True."""
        h = x.reshape(-1, x.shape[-1])
        logits = self.gate(h)
        probs, weight, index = route(
            logits, self.top_k, norm_topk_prob=self.norm_topk_prob, weights_fp32=self.weights_fp32
        )
        y = self.experts(h, index, weight)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            y = y + F.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
        return y.view_as(x), self._stats(probs, index, token_mask)

    def _stats(self, probs: torch.Tensor, index: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
        flat = index.reshape(-1)
        if token_mask is None:
            ones = torch.ones_like(flat, dtype=torch.float32)
            counts = torch.zeros(self.n_experts, device=probs.device).scatter_add_(0, flat, ones)
            prob_sum = probs.sum(0)
        else:
            mask = token_mask.reshape(-1).to(torch.float32)
            counts = torch.zeros(self.n_experts, device=probs.device).scatter_add_(
                0, flat, mask.repeat_interleave(self.top_k)
            )
            prob_sum = (probs * mask.unsqueeze(-1)).sum(0)
        return torch.stack([counts.detach(), prob_sum])


def moe_aux_loss(aux: torch.Tensor, n_rows: int | float | torch.Tensor, n_experts: int) -> torch.Tensor:
    """transformers' ``load_balancing_loss_func`` from summed statistics.

    ``aux [2, E]``: the top-k counts and the router probabilities summed over MoE layers and real
    tokens; ``n_rows = n_moe_layers * n_real_tokens``. Returns ``E * sum_e f_e * P_e`` with ``f``/``P``
    the layer-and-token averages.
    """
    return n_experts * torch.sum((aux[0] / n_rows) * (aux[1] / n_rows))
