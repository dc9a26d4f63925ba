"""Routed experts: the expert compute kernels and the local token dispatcher.

:func:`experts_forward` runs the SwiGLU experts of one rank over tokens already sorted by expert
(``counts[e]`` rows for local expert ``e``), with one of two kernels:

* ``loop``: one ``F.linear`` triple per expert (any device, any dtype; reads the counts on the host);
* ``grouped_mm``: three ``torch._grouped_mm`` calls over all experts (CUDA bf16 is the case it is
  for). Every group is padded to a multiple of :data:`GROUP_ALIGN` rows, computed on the device
  (no host read of the counts), in a buffer of the static upper bound ``N + E * (GROUP_ALIGN - 1)``.

A *dispatcher* turns the router's choice into that sorted layout and back:
``dispatcher(x [N, H], top_k_index [N, k], top_k_weight [N, k], n_experts, compute) -> [N, H]``,
where ``compute(x_sorted, counts_local) -> y_sorted`` runs the local experts. :class:`LocalDispatcher`
(every expert on this rank) is the default of :class:`GroupedExperts`; the expert-parallel
dispatcher (``engine/archon/parallel/expert_parallel.py``) has the same signature and is swapped in
by assigning ``GroupedExperts.dispatcher``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from areal_tasks.errors import EngineError

logger = logging.getLogger(__name__)

#: rows per expert group are padded to a multiple of this for ``torch._grouped_mm``.
GROUP_ALIGN = 16
KERNELS: tuple[str, ...] = ("auto", "loop", "grouped_mm")

Counts = torch.Tensor | Sequence[int]
ExpertCompute = Callable[[torch.Tensor, Counts], torch.Tensor]


def grouped_mm_available() -> bool:
    """Whether this torch has ``torch._grouped_mm``."""
    return hasattr(torch, "_grouped_mm")


def _loop(x: torch.Tensor, counts: Counts, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    host = counts.tolist() if isinstance(counts, torch.Tensor) else list(counts)
    outs, start = [], 0
    for e, n in enumerate(host):
        xs = x[start : start + n]
        outs.append(F.linear(F.silu(F.linear(xs, gate[e])) * F.linear(xs, up[e]), down[e]))
        start += n
    return torch.cat(outs) if outs else x.new_zeros(0, down.shape[1])


def _grouped_mm(
    x: torch.Tensor, counts: Counts, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    n_experts, n_tokens = gate.shape[0], x.shape[0]
    counts_t = torch.as_tensor(counts, device=x.device).to(torch.int64)
    padded = (counts_t + GROUP_ALIGN - 1) // GROUP_ALIGN * GROUP_ALIGN
    ends_padded = torch.cumsum(padded, 0)
    starts = torch.cumsum(counts_t, 0) - counts_t
    expert_of = torch.repeat_interleave(
        torch.arange(n_experts, device=x.device), counts_t, output_size=n_tokens
    )  # output_size: no host read
    dst = torch.arange(n_tokens, device=x.device) - starts[expert_of] + (ends_padded - padded)[expert_of]
    capacity = n_tokens + n_experts * (GROUP_ALIGN - 1)
    xp = x.new_zeros(capacity, x.shape[1]).index_copy(0, dst, x)
    offs = ends_padded.to(torch.int32)
    h = F.silu(torch._grouped_mm(xp, gate.transpose(-2, -1), offs=offs))
    h = h * torch._grouped_mm(xp, up.transpose(-2, -1), offs=offs)
    y = torch._grouped_mm(h, down.transpose(-2, -1), offs=offs)
    return y.index_select(0, dst)


def resolve_kernel(kernel: str, x: torch.Tensor) -> str:
    """``loop`` or ``grouped_mm`` for ``kernel`` (``auto``: grouped_mm on CUDA in bf16 when torch has it)."""
    if kernel not in KERNELS:
        raise EngineError(f"unknown expert kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if kernel == "auto":
        return "grouped_mm" if x.is_cuda and x.dtype == torch.bfloat16 and grouped_mm_available() else "loop"
    if kernel == "grouped_mm" and not grouped_mm_available():
        raise EngineError("expert kernel 'grouped_mm' needs torch._grouped_mm, which this torch lacks")
    return kernel


def experts_forward(
    x_sorted: torch.Tensor,
    counts: Counts,
    gate_proj: torch.Tensor,
    up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    kernel: str = "auto",
) -> torch.Tensor:
    """SwiGLU experts over tokens sorted by local expert: ``[N, H] -> [N, H]``.

    ``gate_proj``/``up_proj`` are ``[E_local, I, H]``, ``down_proj`` ``[E_local, H, I]``; ``counts``
    ``[E_local]`` (a host list or a tensor) sums to ``N``.
    """
    if resolve_kernel(kernel, x_sorted) == "grouped_mm":
        return _grouped_mm(x_sorted, counts, gate_proj, up_proj, down_proj)
    return _loop(x_sorted, counts, gate_proj, up_proj, down_proj)


def _local(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    local = weight.to_local() if isinstance(weight, DTensor) else weight
    return local if local.dtype == dtype else local.to(dtype)


class LocalDispatcher:
    """Dispatch to experts that all live on this rank: sort the (token, choice) pairs by expert, run
    ``compute`` once, weight every result by its router weight and sum over the ``k`` choices."""

    def __call__(
        self,
        x: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weight: torch.Tensor,
        n_experts: int,
        compute: ExpertCompute,
    ) -> torch.Tensor:
        from areal_tasks.engine.archon.parallel.expert_parallel import check_dispatch_inputs, check_expert_output

        check_dispatch_inputs(x, top_k_index, top_k_weight)
        k = top_k_index.shape[1]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token_of = order // k
        counts = torch.bincount(flat, minlength=n_experts)
        x_sorted = x.index_select(0, token_of)
        y = compute(x_sorted, counts)
        check_expert_output(y, x_sorted)
        y = (y * top_k_weight.reshape(-1)[order].unsqueeze(-1)).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token_of, y)


class GroupedExperts(nn.Module):
    """The routed experts of one MoE layer as stacked weights (this rank's ``E_local`` experts)."""

    def __init__(self, n_experts: int, dim: int, hidden: int, *, n_local: int | None = None) -> None:
        super().__init__()
        local = n_experts if n_local is None else n_local
        self.n_experts = n_experts
        self.gate_proj = nn.Parameter(torch.empty(local, hidden, dim))
        self.up_proj = nn.Parameter(torch.empty(local, hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(local, dim, hidden))
        self.kernel = "auto"
        self.dispatcher: Callable[..., torch.Tensor] = LocalDispatcher()

    def compute(self, x_sorted: torch.Tensor, counts: Counts) -> torch.Tensor:
        """The local experts on tokens sorted by local expert (the dispatcher's ``compute``).

        Split over an expert-parallel group the weights are DTensors: their local shard holds this
        rank's experts. Weights outside an FSDP unit (one replica of each expert) stay in the
        master dtype and are cast to the tokens' dtype here."""
        weights = [_local(w, x_sorted.dtype) for w in (self.gate_proj, self.up_proj, self.down_proj)]
        return experts_forward(x_sorted, counts, *weights, self.kernel)

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weight: torch.Tensor) -> torch.Tensor:
        """``x [N, H]`` routed to ``top_k_index [N, k]`` with ``top_k_weight [N, k]`` -> ``[N, H]``."""
        return self.dispatcher(x, top_k_index, top_k_weight, self.n_experts, self.compute)

    def reset_parameters(self, std: float = 0.02) -> None:
        for p in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(p, std=std)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, local={self.gate_proj.shape[0]}, kernel={self.kernel}"
