"""Per-token log-probabilities and entropies of packed sequences, in the batch layout's alignment.

The model's logits at position ``t`` predict token ``t + 1``. :func:`next_token_stats` scores every
position against the next token of the packed stream (``labels = input_ids`` shifted left by one);
:func:`align_to_tokens` then shifts the result right by one so that index ``t`` holds
``log p(input_ids[t] | input_ids[<t])`` and zeroes the first token of every sequence (whose
"previous position" belongs to the previous sequence).

The two steps are separate so that sequence parallelism can score its local slice of positions and
gather the scores before aligning them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: positions scored per chunk; bounds the fp32 copy of the logits to chunk x vocab.
_CHUNK = 4096


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """``input_ids`` shifted left by one (the last label wraps around and is discarded later)."""
    import torch

    return torch.roll(input_ids, shifts=-1, dims=0)


def next_token_stats(
    logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(labels[t] | logits[t] / temperature)`` and optionally the entropy at each position.

    ``logits`` is ``[N, V]`` (any float dtype; scored in fp32), ``labels`` ``[N]``. Differentiable.
    """
    import torch

    logprobs, entropies = [], []
    for start in range(0, logits.shape[0], _CHUNK):
        chunk = logits[start : start + _CHUNK].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        log_z = torch.logsumexp(chunk, dim=-1)
        picked = torch.gather(chunk, -1, labels[start : start + _CHUNK].long().unsqueeze(-1)).squeeze(-1)
        logprobs.append(picked - log_z)
        if with_entropy:
            probs = torch.softmax(chunk, dim=-1)
            entropies.append(log_z - (probs * chunk).sum(-1))
    logprob = torch.cat(logprobs) if logprobs else logits.new_zeros(0, dtype=torch.float32)
    entropy = (torch.cat(entropies) if entropies else logprob.new_zeros(0)) if with_entropy else None
    return logprob, entropy


def align_to_tokens(next_stats: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Shift next-token scores right by one and zero the first token of every sequence.

    Index ``t`` of the result belongs to token ``t``; ``next_stats`` ``[T]`` must cover the whole
    packed stream (the wrap-around score at the last position is dropped).
    """
    import torch

    shifted = torch.roll(next_stats, shifts=1, dims=0)
    # index_fill_ takes the value as a kernel argument; ``keep[idx] = False`` would copy a host scalar
    # to the device and so synchronise with the GPU stream on every call
    keep = torch.ones_like(shifted, dtype=torch.bool).index_fill_(0, cu_seqlens[:-1].long(), False)
    return torch.where(keep, shifted, torch.zeros_like(shifted))
