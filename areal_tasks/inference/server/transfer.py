"""Host-to-device copies of small per-step tables that never wait for the device.

``torch.tensor(values, device="cuda")`` and ``cpu_tensor.to("cuda")`` are blocking copies: PyTorch
synchronises the stream after them, so the host waits for every kernel queued so far. In the
overlapped decode loop that is the forward just launched, so one such copy per step (sampling
settings, slot moves, an eager decode's token ids and positions) turns the overlap off without any
error. On a GPU at batch 256, building a temperature-1 sampling table that way kept the host
waiting about as long as the device's whole sampling work, while the step's own wait for results
fell to almost nothing: the wait was hidden in the copy (docs/benchmarks_history.md, "Inference
throughput (H200)").

:func:`host_to_device` builds the table in pinned memory (PyTorch's caching host allocator keeps a
pinned block from reuse until the copy queued from it has run) and copies it without blocking.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)


def host_to_device(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (numbers or equal-length rows of numbers) as a ``dtype`` tensor on ``device``,
    queued on the current stream without waiting for it."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
