"""The most likely alternatives of each sampled token (``top_logprobs``), for the rows that ask.

A request may ask for the ``k`` most likely tokens at every position it generates: OpenAI's chat
``top_logprobs`` (with ``logprobs: true``), legacy completions' ``logprobs: k`` and SGLang's
``top_logprobs_num``. :class:`TopRows` names the rows of a batch that asked (k > 0) and how many
alternatives each wants; :func:`top_logprobs` then computes, for those rows only, the
``log_softmax`` of **the distribution the sampled token's logprob comes from**: the logits divided
by the row's temperature (the raw logits for a greedy row, whose temperature in the batch is 1),
before any top-k/top-p/min-p filtering. That is SGLang's default (its sampler divides the logits by
the temperature in place before taking their ``log_softmax``); vLLM's default is the raw logits,
the same for greedy rows and temperature 1. One ``topk`` over the batch's largest ``k`` serves
every such row; each row keeps its first ``k`` entries (descending). The sampled token's own
logprob of those rows is taken from the same ``log_softmax``, so it equals its entry among the
alternatives exactly whenever it is one of them.

A batch with no such row costs nothing (no extra kernel, no copy), and the greedy fast path and the
CUDA-graph decode are untouched: the graphs stop at the logits, and this runs after them, eagerly,
like the sampler. Nothing here waits for the device; the engine reads the values back with the
step's tokens (``readback.py``) and :func:`attach` appends each row's list to its sequence's
``output_top_logprobs``, one entry per output token, aligned with ``output_ids``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from areal_tasks.inference.server.transfer import host_to_device

if TYPE_CHECKING:
    from areal_tasks.inference.server.request import Sequence
    from areal_tasks.inference.server.sampling import SamplingBatch

logger = logging.getLogger(__name__)

#: one position's alternatives: (token id, logprob), most likely first.
TopEntry = list[tuple[int, float]]


@dataclass(frozen=True)
class TopRows:
    """The rows of a batch that want alternatives, and how many each wants."""

    #: row indices in the batch (host) and the same on the device.
    rows: list[int]
    index: torch.Tensor
    #: alternatives per row (each >= 1), aligned with ``rows``.
    counts: list[int]

    @property
    def k(self) -> int:
        """The one ``topk`` size that serves every row."""
        return max(self.counts)

    @classmethod
    def build(cls, counts: Seq[int], device: torch.device) -> TopRows | None:
        """The rows of ``counts`` (one per batch row, 0 = none) that are above 0; None if none is."""
        rows = [row for row, count in enumerate(counts) if count > 0]
        if not rows:
            return None
        return cls(rows=rows, index=host_to_device(rows, torch.long, device), counts=[counts[r] for r in rows])


def top_logprobs(
    logits: torch.Tensor, batch: SamplingBatch, tokens: torch.Tensor, logprobs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows of ``batch.top`` (see the module doc): ``(logprobs, top)`` where ``logprobs`` are
    the sampled tokens' logprobs with those rows' taken from the same ``log_softmax`` as their
    alternatives, and ``top`` is ``[2, rows, k]`` float64 (token ids, then their logprobs, most
    likely first), or None (and ``logprobs`` unchanged) when no row asked."""
    top = batch.top
    if top is None:
        return logprobs, None
    index = top.index
    scaled = logits.index_select(0, index).float() / batch.temperatures.index_select(0, index).view(-1, 1)
    table = torch.log_softmax(scaled, dim=-1)
    values, ids = table.topk(min(top.k, table.shape[-1]), dim=-1)
    own = table.gather(1, tokens.index_select(0, index).view(-1, 1)).view(-1)
    logprobs = logprobs.index_copy(0, index, own.to(logprobs.dtype))
    return logprobs, torch.stack((ids.double(), values.double()))


def entries(top: TopRows, host: list[list[list[float]]]) -> list[TopEntry]:
    """Each wanting row's alternatives from the read-back ``[2, rows, k]`` table, ``counts`` each."""
    ids, values = host
    return [[(int(t), v) for t, v in zip(ids[i][:count], values[i][:count])] for i, count in enumerate(top.counts)]


def attach(seqs: list[Sequence], top: TopRows, host: list[list[list[float]]]) -> None:
    """Append each wanting row's alternatives to its sequence, where the step's token was appended
    (a token read after its sequence finished is dropped, and so are its alternatives)."""
    for row, entry in zip(top.rows, entries(top, host)):
        seq = seqs[row]
        if len(seq.output_top_logprobs) < len(seq.output_ids):
            seq.output_top_logprobs.append(entry)
