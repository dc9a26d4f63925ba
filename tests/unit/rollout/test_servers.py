"""The rollout side's server list across a server's death (``areal_tasks/rollout/servers.py``).

A weight swap that fails because a server does not answer goes on without it; one that fails on a
server that answers still fails; a list the controller published after a restart is adopted at the
next swap, except for collective updates (the group has a fixed size).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceControlError
from areal_tasks.rollout.servers import ServerRoster, read_server_list, write_server_list


class FleetClient:
    """The client methods the roster uses; ``down`` servers fail health and swaps."""

    def __init__(self, addresses: list[str], down: set[str] = frozenset()) -> None:
        self.addresses = [f"http://{a}" for a in addresses]
        self.down = {f"http://{a}" for a in down}
        self.swapped: list[list[str]] = []

    def set_servers(self, addresses: list[str]) -> None:
        self.addresses = [a if a.startswith("http") else f"http://{a}" for a in addresses]

    async def check_health(self) -> dict[str, bool]:
        return {a: a not in self.down for a in self.addresses}

    async def swap_weights(self, meta: Any, buckets: Any, mode: str) -> dict[str, float]:
        if self.down & set(self.addresses):
            raise InferenceControlError(f"swap failed on {sorted(self.down & set(self.addresses))}")
        self.swapped.append(list(self.addresses))
        return {"pause": 0.0, "transfer": 0.0, "resume": 0.0}


def _meta(kind: str = "disk") -> WeightUpdateMeta:
    if kind == "disk":
        return WeightUpdateMeta(type="disk", version=3, path="/tmp/w")
    return WeightUpdateMeta(type="collective", version=3, master_addr="127.0.0.1", master_port=1, world_size=3)


def test_a_swap_goes_on_without_servers_that_do_not_answer() -> None:
    client = FleetClient(["a:1", "b:2"], down={"a:1"})
    roster = ServerRoster(None)
    parts = asyncio.run(roster.swap_without_unreachable(client, _meta(), None, "abort", InferenceControlError("x")))
    assert parts["pause"] == 0.0 and client.swapped == [["http://b:2"]] and client.addresses == ["http://b:2"]


@pytest.mark.parametrize("down", [set(), {"a:1", "b:2"}], ids=["all-answer", "none-answers"])
def test_the_failure_stands_when_no_server_or_every_server_is_down(down: set[str]) -> None:
    client = FleetClient(["a:1", "b:2"], down=down)
    with pytest.raises(InferenceControlError, match="original"):
        asyncio.run(
            ServerRoster(None).swap_without_unreachable(
                client, _meta(), None, "abort", InferenceControlError("original")
            )
        )
    assert client.addresses == ["http://a:1", "http://b:2"]


def test_a_collective_update_is_never_retried_on_fewer_servers() -> None:
    client = FleetClient(["a:1", "b:2"], down={"a:1"})
    with pytest.raises(InferenceControlError, match="original"):
        asyncio.run(
            ServerRoster(None).swap_without_unreachable(
                client, _meta("collective"), None, "abort", InferenceControlError("original")
            )
        )


def test_a_published_list_is_adopted_once_and_not_for_collective_updates(tmp_path: Path) -> None:
    path = tmp_path / "inference_servers.json"
    client = FleetClient(["a:1", "b:2"])
    roster = ServerRoster(path)
    roster.refresh(client, _meta())  # nothing published yet
    assert client.addresses == ["http://a:1", "http://b:2"]
    write_server_list(path, ["c:3", "b:2"])
    assert read_server_list(path) == ["c:3", "b:2"]
    roster.refresh(client, _meta("collective"))
    assert client.addresses == ["http://a:1", "http://b:2"]
    write_server_list(path, ["d:4", "b:2"])
    roster.refresh(client, _meta())
    assert client.addresses == ["http://d:4", "http://b:2"]
