"""Capture and restore the random-number generators of one rank: Python, NumPy, torch CPU and CUDA.

Every rank has its own states (dropout masks, sampling, shuffles differ per rank), so each rank
writes ``rng/rank-<r>.json`` and restores its own file on resume. The states are plain JSON (the
torch states as base64 bytes), readable without unpickling anything.
"""

from __future__ import annotations

import base64
import logging
import random
from typing import Any

from areal_tasks.errors import CheckpointError

logger = logging.getLogger(__name__)

RNG_FORMAT = 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def capture_rng_state() -> dict[str, Any]:
    """The current RNG states of this process as JSON-able data."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    state: dict[str, Any] = {
        "format": RNG_FORMAT,
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "kind": np_kind,
            "keys": [int(k) for k in np_keys],
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # the device this rank computes on only: the others may be visible (for NCCL's peer-to-peer
        # path) but are not this rank's, and reading their state would create a context on each
        state["cuda"] = [_b64(torch.cuda.get_rng_state().numpy().tobytes())]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set this process's RNGs to ``state`` (as returned by :func:`capture_rng_state`)."""
    import numpy as np
    import torch

    if state.get("format") != RNG_FORMAT:
        raise CheckpointError(f"RNG state format {state.get('format')!r} is not supported (expected {RNG_FORMAT})")
    try:
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        npy = state["numpy"]
        keys = np.asarray(npy["keys"], dtype=np.uint32)
        np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"RNG state is malformed: {exc}") from exc
    cuda = state.get("cuda") or []
    if cuda:
        if not torch.cuda.is_available():
            logger.warning("checkpoint holds a CUDA RNG state but this process has no GPU: not restored")
            return
        # one state (this rank's device); a checkpoint of an older version holds one per visible
        # device, of which this rank's is the one at its device index
        index = torch.cuda.current_device()
        chosen = cuda[0] if len(cuda) == 1 else cuda[index] if index < len(cuda) else None
        if chosen is None:
            logger.warning("checkpoint holds %d CUDA RNG states, none for device %d: not restored", len(cuda), index)
            return
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(chosen)), dtype=torch.uint8))
