"""Step timing of the train throughput benchmark (``train_throughput.py``, also ``archon_moe.py``):
each step between two device synchronisations, or the steps back to back as a training loop runs
them, and the garbage collector kept out of the timed steps (``--freeze-gc``).

Run as part of a benchmark script: ``benchmarks/`` is the script's directory, first on
``sys.path``, so the sibling ``train_batches`` imports as a top-level module.
"""

from __future__ import annotations

import gc
import time

import torch
from train_batches import pg_loss, token_weight  # benchmarks/ is first on sys.path

from areal_tasks.engine.fsdp.engine import FSDPEngine


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _freeze_gc() -> None:
    """Collect once, move every live object out of the collector's view and switch automatic
    collection off (``--freeze-gc``): no collection pause can fall inside a timed step."""
    gc.collect()
    gc.freeze()
    gc.disable()


def _timed_synced(engine: FSDPEngine, batches: list[dict]) -> tuple[list[float], list[dict]]:
    """Each step between two synchronisations: its wall time includes the host's ramp before the
    device has work queued."""
    times, results = [], []
    for batch in batches:
        _sync()
        start = time.perf_counter()
        results.append(engine.train_batch(batch, pg_loss, token_weight))
        _sync()
        times.append(time.perf_counter() - start)
    return times, results


def _timed_pipelined(engine: FSDPEngine, batches: list[dict]) -> tuple[list[float], list[dict]]:
    """The steps back to back: step ``k``'s stats are read after step ``k + 1`` is submitted. A
    step's time runs from the previous read-back to its own, so the times sum to the window
    between a synchronisation before the first step and the last read-back."""
    times, results = [], []
    _sync()
    last = time.perf_counter()
    previous = None
    for batch in [*batches, None]:
        submitted = engine.submit_train_batch(batch, pg_loss, token_weight) if batch is not None else None
        if previous is not None:
            results.append(previous.result())
            now = time.perf_counter()
            times.append(now - last)
            last = now
        previous = submitted
    return times, results
