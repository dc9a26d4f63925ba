"""Keeping the rollout client's server list in step with the fleet across a server's death.

The controller restarts a dead inference server on a new port (``ServerFleet.check``) and writes
the fleet's addresses to ``<run_dir>/inference_servers.json`` (:func:`write_server_list`). The
rollout side reads it at the start of each weight update (:meth:`ServerRoster.refresh`): a
restarted server joins the client's list right then, so it receives the update's full weights
before it is given any request (it came back with the starting weights). A collective update
cannot add a server (the trainer's group has a fixed size): the restarted server then stays unused,
with a warning.

A server that died and is not back yet makes the weight update fail on it. When the failure is
that servers do not answer at all (their health probe fails too) and at least one server does,
:meth:`ServerRoster.swap_without_unreachable` drops them from the client's list and swaps again on
the others: the run goes on with fewer servers instead of failing, and a dead server never serves
weights older than the others'. A server that answered with an error is not dropped: the update
fails as before.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import InferenceControlError

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine, ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["ServerRoster", "read_server_list", "write_server_list"]


def write_server_list(path: str | os.PathLike[str], addresses: Sequence[str]) -> None:
    """Publish the fleet's current addresses (atomically: a reader sees the old list or the new one)."""
    from storage.atomic import write_local_text

    write_local_text(Path(path), json.dumps({"addresses": list(addresses)}))


def read_server_list(path: str | os.PathLike[str]) -> list[str] | None:
    """The published addresses, or None when nothing was published."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return [str(a) for a in json.loads(text)["addresses"]]


def _normalized(addresses: Sequence[str]) -> list[str]:
    return [a if a.startswith(("http://", "https://")) else f"http://{a}" for a in (x.rstrip("/") for x in addresses)]


class ServerRoster:
    """The fleet-facing side of a weight swap for one client (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else Path(path)
        self._seen: list[str] | None = None

    def refresh(self, engine: InferenceEngine, meta: WeightUpdateMeta) -> None:
        """Adopt a newly published server list before the update ``meta`` (not for collective ones)."""
        set_servers = getattr(engine, "set_servers", None)
        if self.path is None or set_servers is None:
            return
        published = read_server_list(self.path)
        if published is None or published == self._seen:
            return
        self._seen = published
        current = list(getattr(engine, "addresses", []))
        if _normalized(published) == _normalized(current):
            return
        if meta.type == "collective":
            logger.warning(
                "the fleet now serves at %s, but a collective weight-update group cannot take new members: "
                "the client keeps %s",
                published,
                current,
            )
            return
        logger.warning(
            "the fleet's servers changed: %s -> %s (a restarted server gets this update)", current, published
        )
        set_servers(published)

    async def swap_without_unreachable(
        self,
        engine: InferenceEngine,
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        mode: PauseMode,
        failure: InferenceControlError,
    ) -> dict[str, Any]:
        """After ``failure`` of a swap: drop the servers that do not answer and swap on the others;
        re-raise ``failure`` when every server answers (the error is elsewhere), none does, or the
        client cannot change its servers (or the update is collective)."""
        check_health = getattr(engine, "check_health", None)
        set_servers = getattr(engine, "set_servers", None)
        if check_health is None or set_servers is None or meta.type == "collective":
            raise failure
        health: dict[str, bool] = await check_health()
        alive = [address for address, ok in health.items() if ok]
        dead = [address for address, ok in health.items() if not ok]
        if not dead or not alive:
            raise failure
        logger.error(
            "weight update to version %d failed on unreachable servers %s (%s); going on with %s",
            meta.version,
            dead,
            failure,
            alive,
        )
        set_servers(alive)
        return await engine.swap_weights(meta, buckets, mode)
