"""``WeightPublisher.close``: the servers leave the collective group while rank 0 destroys its side.

Both sides must be in the teardown at the same time (NCCL's destroy waits for the peers), so the
fakes here each wait for the other to have started: run one after the other, the test would time
out. The publisher's transport is the real collective one, holding a fake joined group. A server
that cannot be reached is logged, not raised; nothing happens for disk updates or before the group
was ever joined; close is idempotent.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace

from areal_tasks.errors import InferenceControlError
from areal_tasks.trainer.weight_publisher import WeightPublisher
from areal_tasks.weights.collective import CollectiveTransport

WAIT_S = 10.0


class Rendezvous:
    """Two parties that each record entering and then wait until both have entered."""

    def __init__(self) -> None:
        self.trainer, self.servers = threading.Event(), threading.Event()
        self.order: list[str] = []

    def enter(self, mine: threading.Event, other: threading.Event, who: str) -> bool:
        mine.set()
        self.order.append(who)
        return other.wait(WAIT_S)


class FakeGroup:
    def __init__(self, meet: Rendezvous) -> None:
        self.meet, self.met = meet, None

    def destroy(self) -> bool:
        self.met = self.meet.enter(self.meet.trainer, self.meet.servers, "trainer")
        return True


class FakeExecutor:
    def __init__(self, meet: Rendezvous, fail: bool = False) -> None:
        self.meet, self.fail, self.calls, self.met = meet, fail, 0, None

    def destroy_weight_groups(self) -> list[str]:
        self.calls += 1
        self.met = self.meet.enter(self.meet.servers, self.meet.trainer, "servers")
        if self.fail:
            raise InferenceControlError("destroy_weights_update_group(g) failed on 1 of 1 servers: refused")
        return ["g"]


def _publisher(
    meet: Rendezvous, *, fail: bool = False, joined: bool = True, mode: str = "collective"
) -> tuple[WeightPublisher, FakeGroup, FakeExecutor]:
    group, executor = FakeGroup(meet), FakeExecutor(meet, fail)
    cfg = SimpleNamespace(rollout=SimpleNamespace(weight_update=mode, pause_mode="abort"))
    side = SimpleNamespace(executor=executor, n_servers=1)
    publisher = WeightPublisher(cfg, SimpleNamespace(), side, Path("."))  # type: ignore[arg-type]
    if joined:  # as after the first collective update: the group's port agreed, the group joined
        transport = publisher.transport
        assert isinstance(transport, CollectiveTransport)
        transport._port = 1
        transport._groups[("127.0.0.1", 1, "g")] = group  # type: ignore[assignment]
    return publisher, group, executor


def _groups(publisher: WeightPublisher) -> dict:
    return publisher.transport._groups  # type: ignore[attr-defined]


def test_close_runs_the_servers_leave_concurrently_with_the_trainer_destroy() -> None:
    meet = Rendezvous()
    publisher, group, executor = _publisher(meet)
    publisher.close()
    assert group.met is True and executor.met is True, "each side must see the other enter the teardown"
    assert _groups(publisher) == {}
    publisher.close()  # idempotent
    assert executor.calls == 1


def test_a_server_that_fails_to_leave_is_logged_not_raised(caplog) -> None:
    publisher, group, _executor = _publisher(Rendezvous(), fail=True)
    with caplog.at_level(logging.WARNING):
        publisher.close()
    assert group.met is True and _groups(publisher) == {}
    assert "did not all leave the weight-update group" in caplog.text and "refused" in caplog.text


def test_nothing_to_tear_down_before_the_first_join() -> None:
    publisher, group, executor = _publisher(Rendezvous(), joined=False)
    publisher.close()
    assert executor.calls == 0 and group.met is None


def test_nothing_for_the_servers_to_leave_after_disk_updates() -> None:
    publisher, group, executor = _publisher(Rendezvous(), joined=False, mode="disk")
    publisher.close()
    assert executor.calls == 0 and group.met is None
