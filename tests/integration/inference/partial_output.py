"""Pausing a client at a moment when some request holds partial output, for the tests of a weight
update in the middle of generation (the protocol suite here and the vLLM tests import it from this
folder, which their conftests put on ``sys.path``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any


async def pause_with_partial_output(client: Any, tasks: Sequence[asyncio.Task], max_new_tokens: int) -> list:
    """Pause at a moment when some request has partial output (retrying with longer waits)."""
    for attempt in range(40):
        await asyncio.sleep(0.02 * (attempt + 1))
        if all(t.done() for t in tasks):
            raise AssertionError("every request finished before a pause caught one; raise max_new_tokens")
        await client.pause()
        for _ in range(500):
            partial = [r for r in client.inflight() if r.held and 0 < r.n_output_tokens < max_new_tokens]
            if partial:
                return partial
            await asyncio.sleep(0.01)
        await client.resume()
    raise AssertionError("no pause caught a request with partial output")
