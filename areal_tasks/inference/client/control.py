"""Control calls sent to every server at once (pause, resume, weight updates, health, version).

:func:`fan_out` runs one call per server concurrently and raises one
:class:`~areal_tasks.errors.InferenceControlError` naming every server that failed, so a weight
update is either applied everywhere or reported as failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from areal_tasks.errors import InferenceConnectionError, InferenceControlError
from areal_tasks.inference.client.protocol import HttpCall, ProtocolAdapter
from areal_tasks.inference.client.transport import HttpTransport

logger = logging.getLogger(__name__)

__all__ = ["fan_out", "probe_all"]


async def _one(
    transport: HttpTransport, adapter: ProtocolAdapter, address: str, call: HttpCall, timeout_s: float
) -> tuple[str | None, Any]:
    try:
        status, payload = await transport.send(address, call, timeout_s)
    except InferenceConnectionError as exc:
        return str(exc), None
    return adapter.control_error(call, status, payload), payload


async def fan_out(
    transport: HttpTransport,
    adapter: ProtocolAdapter,
    addresses: Sequence[str],
    make_call: Callable[[int, str], HttpCall],
    timeout_s: float,
    what: str,
) -> list[Any]:
    """Send ``make_call(index, address)`` to every server; return their payloads in order.

    Raises InferenceControlError (listing each failing server and why) if any failed.
    """
    calls = [make_call(i, a) for i, a in enumerate(addresses)]
    results = await asyncio.gather(*(_one(transport, adapter, a, c, timeout_s) for a, c in zip(addresses, calls)))
    failures = [f"{a}: {err}" for a, (err, _) in zip(addresses, results) if err is not None]
    if failures:
        raise InferenceControlError(
            f"{what} failed on {len(failures)} of {len(addresses)} servers: " + "; ".join(failures)
        )
    logger.debug("%s done on %d servers", what, len(addresses))
    return [payload for _, payload in results]


async def probe_all(
    transport: HttpTransport, adapter: ProtocolAdapter, addresses: Sequence[str], call: HttpCall, timeout_s: float
) -> dict[str, tuple[str | None, Any]]:
    """``address -> (error or None, payload)`` of ``call`` on every server; never raises."""
    results = await asyncio.gather(*(_one(transport, adapter, a, call, timeout_s) for a in addresses))
    return dict(zip(addresses, results))
