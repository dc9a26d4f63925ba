"""Deferred read-back of a decode step's sampled tokens, for the overlapped engine loop.

A decode step's sampled token ids stay on the device as the next step's inputs
(:attr:`InflightStep.tokens`); the host needs their values only to extend each sequence's output
and to check its finish rules. :meth:`ReadbackBuffer.start` queues one device-to-host copy of the
token ids and their logprobs into a pinned buffer and records an event behind it, so the host can
launch the next step first and collect these values (:meth:`InflightStep.results`) while the
device computes. On the CPU the copy is synchronous and there is no event: the same code runs,
without the overlap.

One buffer serves the whole engine: the engine reads a step's results before it queues the next
read-back, so a buffer is never written while it is still being read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from areal_tasks.inference.server.request import Sequence

logger = logging.getLogger(__name__)


@dataclass
class InflightStep:
    """A decode step whose forward and sampling are queued on the device and whose results the host
    has not read yet."""

    #: the step's rows, in order.
    seqs: list[Sequence]
    #: the sampled token ids [rows] on the device (the next step's inputs for these rows).
    tokens: torch.Tensor
    #: [2, rows] float64 on the host: token ids (exact below 2**53) and their logprobs.
    host: torch.Tensor
    #: recorded after the copy into ``host`` (None on the CPU, where the copy is synchronous).
    event: torch.cuda.Event | None

    def results(self) -> tuple[list[float], list[float]]:
        """Wait for the copy, then return (token ids, logprobs) as Python lists."""
        if self.event is not None:
            self.event.synchronize()
        tokens, logprobs = self.host.tolist()
        return tokens, logprobs


class ReadbackBuffer:
    """The host buffer that decode steps' results are copied into (see the module doc)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.device = device
        self._on_cuda = device.type == "cuda"
        self._host = torch.empty(2, max(rows, 1), dtype=torch.float64, pin_memory=self._on_cuda)
        self._event = torch.cuda.Event() if self._on_cuda else None

    def start(self, seqs: list[Sequence], tokens: torch.Tensor, logprobs: torch.Tensor) -> InflightStep:
        """Queue the copy of one step's ``tokens`` and ``logprobs`` ([rows] each, on the device)."""
        rows = tokens.shape[0]
        if rows > self._host.shape[1]:
            self._host = torch.empty(2, rows, dtype=torch.float64, pin_memory=self._on_cuda)
        host = self._host[:, :rows]
        host.copy_(torch.stack((tokens.double(), logprobs.double())), non_blocking=self._on_cuda)
        if self._event is not None:
            self._event.record()
        return InflightStep(seqs=seqs, tokens=tokens, host=host, event=self._event)
