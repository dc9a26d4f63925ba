"""A greedy step's tokens and logprobs in one pass over the logits.

Greedy decoding needs each row's argmax and its log-probability: the row's maximum minus its
log-sum-exp. Eagerly that is an fp32 copy of the ``[B, V]`` logits and two reductions over it,
which at batch 256 and a 151,936-token vocabulary is a sizeable share of a decode step's device
time (docs/benchmarks_history.md, "Inference throughput (H200)", second session). Compiled, the
same function reads the half-precision logits once, upcasting in registers.

:class:`GreedyPicker` is what a model runner hands the sampler: eager by default, compiled where
the runner compiles (CUDA with ``torch_compile``), and warmed up for the batch shapes that would
otherwise compile on the first request (``dynamic=True`` serves every batch size but 1).
"""

from __future__ import annotations

import torch


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax ids [B] int64, their logprobs [B] float32) of ``logits`` [B, V] of any float dtype."""
    scores = logits.float()
    best, tokens = scores.max(dim=-1)
    return tokens, best - torch.logsumexp(scores, dim=-1)


class GreedyPicker:
    """:func:`greedy_pick`, through ``torch.compile`` for half-precision logits when ``compiled``."""

    def __init__(self, compiled: bool = False) -> None:
        self._fused = torch.compile(greedy_pick, dynamic=True) if compiled else None

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fused is not None and logits.dtype in (torch.bfloat16, torch.float16):
            return self._fused(logits)
        return greedy_pick(logits)

    def warm_up(self, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        """Compile now for one row and for several (the shapes a server meets first)."""
        if self._fused is None:
            return
        for rows in (1, 2):
            self(torch.zeros(rows, vocab, dtype=dtype, device=device))
