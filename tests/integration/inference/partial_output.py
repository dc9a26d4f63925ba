"""Pausing a client at a moment when some request holds partial output, for the tests of a weight
update in the middle of generation (the protocol suite here and the vLLM tests import it from this
folder, which their conftests put on ``sys.path``).

Whether a pause lands mid-generation is a race with the server: on a fast (or just warmed-up)
server every request may finish before the pause takes effect. A round whose requests all finish
first is not a failure of the code under test, so :func:`start_and_pause` starts fresh requests for
another round; only several rounds in a row without a catch fail the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

ROUNDS = 4


async def _pause_once_caught(client: Any, tasks: Sequence[asyncio.Task], max_new_tokens: int) -> list | None:
    """Pause (retrying with longer waits) until some request has partial output; returns those
    requests, still paused, or None once every request has finished (nothing left to catch)."""
    for attempt in range(40):
        await asyncio.sleep(0.02 * (attempt + 1))
        if all(t.done() for t in tasks):
            return None
        await client.pause()
        for _ in range(500):
            inflight = client.inflight()
            partial = [r for r in inflight if r.held and 0 < r.n_output_tokens < max_new_tokens]
            if partial:
                return partial
            if all(t.done() for t in tasks):
                break
            if len(inflight) == len(tasks) and all(r.held for r in inflight):
                break  # the pause landed before any token: every request waits at the gate, none has output
            await asyncio.sleep(0.01)
        await client.resume()
    raise AssertionError("no pause caught a request with partial output")


async def start_and_pause(
    client: Any, launch: Callable[[], list[asyncio.Task]], max_new_tokens: int, rounds: int = ROUNDS
) -> tuple[list[asyncio.Task], list]:
    """Start requests with ``launch()`` and pause the client while some hold partial output;
    returns the tasks and the caught requests (the client is left paused). Up to ``rounds`` rounds
    of fresh requests, each lost when they all finish before a pause catches one."""
    for _ in range(rounds):
        tasks = launch()
        partial = await _pause_once_caught(client, tasks, max_new_tokens)
        if partial is not None:
            return tasks, partial
        await asyncio.gather(*tasks)
    raise AssertionError(f"in {rounds} rounds every request finished before a pause caught one; raise max_new_tokens")
