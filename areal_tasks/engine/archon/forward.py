"""One packed micro-batch through an archon decoder without pipeline stages: per-token log-probs and
entropy (actor) or values (critic), aligned to the tokens, plus the MoE load-balancing loss.

The decoder scores each position against the next token itself (``labels``), so the engine never
materialises the logits outside the model. With context parallelism (``cp > 1``) every rank feeds
its contiguous ``T / cp`` slice, the attention trades slices for heads (Ulysses, inside the model)
and the per-position scores are gathered back to ``[T]`` before they are aligned; the MoE statistics
are summed over the context-parallel ranks, forward only (every rank computes the same loss from
the sums, so each keeps the gradient of its own tokens, as with the gathered scores).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.api.batch import CU_SEQLENS, INPUT_IDS, POSITION_IDS
from areal_tasks.engine.parallel.ulysses import gather_sequence
from areal_tasks.errors import EngineError
from areal_tasks.kernels.logprobs import align_to_tokens, next_token_labels

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

__all__ = ["AUX_LOSS_KEY", "ArchonForward", "HeadSpec", "outputs_from_scores", "sum_over_group"]

#: the key of the MoE load-balancing loss in a forward's outputs (and in the step's stats).
AUX_LOSS_KEY = "moe_aux_loss"


@dataclass(frozen=True)
class HeadSpec:
    """What the last stage computes: ``actor`` log-probs at ``temperature`` or ``critic`` values."""

    role: str
    temperature: float = 1.0
    #: let gradients flow through the entropy (an entropy bonus); otherwise it is detached.
    grad_entropy: bool = False
    #: MoE: experts in the model (0 = dense), MoE layers and the aux-loss weight.
    n_experts: int = 0
    n_moe_layers: int = 0


def sum_over_group(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """``x`` summed over ``group`` in the forward; the backward passes the gradient through unchanged
    (every rank of the group computes the same loss from the sum)."""
    return _sum_fn().apply(x, group)


_SUM_FN: Any = None


def _sum_fn() -> Any:
    global _SUM_FN
    if _SUM_FN is None:
        import torch
        import torch.distributed as dist

        class _SumForward(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
                out = x.clone()
                dist.all_reduce(out, group=group)
                return out

            @staticmethod
            def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
                return grad, None

        _SUM_FN = _SumForward
    return _SUM_FN


def outputs_from_scores(
    scores: torch.Tensor, cu_seqlens: torch.Tensor, spec: HeadSpec, *, with_entropy: bool
) -> dict[str, torch.Tensor]:
    """``{"logprobs", "entropy"?}`` or ``{"values"}`` ``[T]`` from the decoder's per-position output
    ``[T, 2]`` (actor) or ``[T, 1]`` (critic), covering the whole packed row."""
    if spec.role == "critic":
        return {"values": align_to_tokens(scores[:, 0], cu_seqlens)}
    out = {"logprobs": align_to_tokens(scores[:, 0], cu_seqlens)}
    if with_entropy:
        entropy = scores[:, 1] if spec.grad_entropy else scores[:, 1].detach()
        out["entropy"] = align_to_tokens(entropy, cu_seqlens)
    return out


def aux_loss_of(aux: torch.Tensor, n_tokens: int, spec: HeadSpec) -> torch.Tensor:
    """HF's load-balancing loss from the summed statistics of ``n_tokens`` real tokens."""
    from areal_tasks.engine.archon.model.moe import moe_aux_loss

    return moe_aux_loss(aux, spec.n_moe_layers * n_tokens, spec.n_experts)


class ArchonForward:
    """Runs a whole (unstaged) decoder on packed micro-batches for one rank."""

    def __init__(self, model: torch.nn.Module, spec: HeadSpec, cp_group: ProcessGroup | None) -> None:
        import torch.distributed as dist

        self.model = model
        self.spec = spec
        self.cp_group = cp_group
        self.cp = 1 if cp_group is None else dist.get_world_size(cp_group)
        self.cp_rank = 0 if cp_group is None else dist.get_rank(cp_group)

    def __call__(
        self, mb: dict[str, torch.Tensor], *, with_entropy: bool = False, bounds: tuple[int, ...] | None = None
    ) -> dict[str, torch.Tensor]:
        """Per-token outputs of ``mb`` (``[T]`` each) and, for a MoE model, ``moe_aux_loss`` (a scalar)."""
        import torch

        ids, cu, positions = mb[INPUT_IDS], mb[CU_SEQLENS], mb[POSITION_IDS]
        labels = next_token_labels(ids)
        total = ids.shape[0]
        if bounds is None:
            bounds = tuple(int(b) for b in cu.tolist())
        if self.cp > 1:
            if total % self.cp:
                raise EngineError(
                    f"a micro-batch of {total} tokens cannot be split over c{self.cp} context-parallel ranks; "
                    "micro_batch.pad_to_multiple_of must be a multiple of c"
                )
            local = total // self.cp
            part = slice(self.cp_rank * local, (self.cp_rank + 1) * local)
            ids, positions, labels = ids[part], positions[part], labels[part]
        kwargs: dict[str, Any] = {
            "position_ids": positions.unsqueeze(0),
            "cu_seqlens": cu.to(torch.int32),
            "bounds": bounds,
            "temperature": self.spec.temperature,
        }
        if self.spec.role != "critic":
            kwargs["labels"] = labels.unsqueeze(0)
        out = self.model(ids.unsqueeze(0), **kwargs)
        aux = None
        if isinstance(out, tuple):
            out, aux = out
        scores = out[0]
        if self.cp > 1:
            scores = torch.stack(
                [gather_sequence(scores[:, i].contiguous(), self.cp_group) for i in range(scores.shape[1])], 1
            )
        result = outputs_from_scores(scores, cu, self.spec, with_entropy=with_entropy)
        if aux is not None and self.spec.n_experts:
            if self.cp > 1:
                aux = sum_over_group(aux, self.cp_group)
            result[AUX_LOSS_KEY] = aux_loss_of(aux, total, self.spec)
        return result
