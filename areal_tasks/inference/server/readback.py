"""Deferred read-back of a decode step's sampled tokens, for the overlapped engine loop.

A decode step's sampled token ids stay on the device as the next step's inputs
(:attr:`InflightStep.tokens`); the host needs their values only to extend each sequence's output
and to check its finish rules. :meth:`ReadbackBuffer.start` queues one device-to-host copy of the
token ids and their logprobs into a pinned buffer and records an event behind it, so the host can
launch the next step first and collect these values (:meth:`InflightStep.results`) while the
device computes. On the CPU the copy is synchronous and there is no event: the same code runs,
without the overlap.

A step whose batch has rows that want their tokens' alternatives (``top_logprobs.py``) also queues
the copy of that ``[2, rows, k]`` table, into pinned memory of its own, before the event; a step
without such rows copies nothing more.

Two buffers (and events) are used in turn: the engine queues step N+1's read-back before it reads
step N's, and reads step N's before it queues step N+2's, so a buffer is never written while its
values are still to be read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from areal_tasks.inference.server.request import Sequence
    from areal_tasks.inference.server.top_logprobs import TopRows

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
    #: seconds :meth:`results` waited for the device.
    waited: float = 0.0
    #: the rows that want alternatives and their ``[2, rows, k]`` table on the host (None: none).
    top: TopRows | None = None
    top_host: torch.Tensor | None = None

    def results(self) -> tuple[list[int], list[float]]:
        """Wait for the copy, then return (token ids, logprobs) as Python lists (the ids as ints:
        converted in one pass here, not one ``int()`` a row in the engine's loop)."""
        if self.event is not None:
            started = time.perf_counter()
            self.event.synchronize()
            self.waited = time.perf_counter() - started
        return self.host[0].long().tolist(), self.host[1].tolist()

    def top_results(self) -> list[list[list[float]]] | None:
        """The alternatives' table as Python lists (call after :meth:`results`), or None."""
        return None if self.top_host is None else self.top_host.tolist()


class ReadbackBuffer:
    """The host buffers that decode steps' results are copied into (see the module doc)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.device = device
        self._on_cuda = device.type == "cuda"
        self._hosts = [self._buffer(rows) for _ in range(2)]
        self._events = [torch.cuda.Event() for _ in range(2)] if self._on_cuda else [None, None]
        self._turn = 0

    def _buffer(self, rows: int) -> torch.Tensor:
        """Flat, so that the ``[2, rows]`` view of a smaller step is contiguous: a copy into a strided
        slice of pinned memory goes through a host temporary and waits for the device."""
        return torch.empty(2 * max(rows, 1), dtype=torch.float64, pin_memory=self._on_cuda)

    def start(
        self,
        seqs: list[Sequence],
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        top: TopRows | None = None,
        top_table: torch.Tensor | None = None,
    ) -> InflightStep:
        """Queue the copy of one step's ``tokens`` and ``logprobs`` ([rows] each, on the device),
        and of ``top_table`` (the alternatives of the rows of ``top``) when there is one."""
        turn, rows = self._turn, tokens.shape[0]
        self._turn ^= 1
        if 2 * rows > self._hosts[turn].numel():
            self._hosts[turn] = self._buffer(rows)
        host, event = self._hosts[turn][: 2 * rows].view(2, rows), self._events[turn]
        host.copy_(torch.stack((tokens.double(), logprobs.double())), non_blocking=self._on_cuda)
        top_host = None
        if top is not None and top_table is not None:
            top_host = torch.empty(top_table.shape, dtype=torch.float64, pin_memory=self._on_cuda)
            top_host.copy_(top_table, non_blocking=self._on_cuda)
        if event is not None:
            event.record()
        return InflightStep(seqs=seqs, tokens=tokens, host=host, event=event, top=top, top_host=top_host)
