"""The server's start-up heap moved out of the garbage collector's sight (``gc.freeze``).

After start-up ``areal serve`` holds a few hundred thousand objects that live as long as the
process: the model's modules, compiled graphs and their guards, the tokenizer, FastAPI's routes.
Python's cyclic collector traverses every one of them on each full collection, with the
interpreter lock held: 232 ms for the kit's tiny model on this project's CPU machine (412k
objects), more for a compiled 0.5B model. A burst of requests allocates enough surviving objects
(sequences, futures, answers) to set such collections off, and during one neither the engine
thread nor the HTTP thread runs: over 12 bursts of ``/generate`` calls to the tiny model on CPU
(1,024 calls of 16 new tokens, 256 of 64) the server ran 11 full collections of 197-287 ms each;
with the heap frozen, 14 of 7-85 ms, and the 1,024-call bursts' median went from 1.17-1.31 s to
0.94 s. :func:`freeze_startup_heap` collects once and then freezes what
is left, so later collections look only at objects made while serving (vLLM freezes its engine's
heap after start-up too). Objects frozen are still freed by reference counting; only reference
cycles among them stay until the process ends, which for start-up objects is when they would go
anyway.

Called by :func:`~areal_tasks.inference.server.server.run_server` (the ``areal serve`` process),
not by ``build_app``: a test process that builds many apps must keep collecting their cycles.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrozenHeap:
    """What :func:`freeze_startup_heap` did: objects frozen in all, and the collection's seconds."""

    objects: int
    collect_s: float


def freeze_startup_heap() -> FrozenHeap:
    """Collect garbage once, then freeze every object left (see the module doc)."""
    started = time.perf_counter()
    gc.collect()
    collect_s = time.perf_counter() - started
    gc.freeze()
    frozen = FrozenHeap(objects=gc.get_freeze_count(), collect_s=collect_s)
    logger.info(
        "froze the start-up heap: %d objects out of the collector's sight (a full collection took %.0f ms)",
        frozen.objects,
        1e3 * collect_s,
    )
    return frozen
