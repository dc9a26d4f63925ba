"""``WeightPublisher``: the transport is built once from ``rollout.weight_update``, and every update
runs the one sequence every mode shares, with the timing breakdown the loop logs.

A recording transport is registered for the test: the publisher must read the mode once (at
construction), build one transport for all updates, send before the pause, or, for a transport
whose servers receive while it sends, while the (fake) servers swap, and report the parts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.trainer.weight_publisher import WeightPublisher
from areal_tasks.weights.base import PublishContext, WeightTransport
from areal_tasks.weights.registry import WEIGHT_TRANSPORTS

WAIT_S = 10.0


class Recording(WeightTransport):
    """Records the calls of the update sequence (one log shared by the test)."""

    name: ClassVar[str] = "recording"
    built: ClassVar[list[Recording]] = []
    log: ClassVar[list[str]] = []

    def __init__(self, source: Any, context: PublishContext) -> None:
        super().__init__(source, context)
        Recording.built.append(self)
        self.sending = threading.Event()

    def plan(self, version: int) -> WeightUpdateMeta:
        self.log.append(f"plan {version}")
        return WeightUpdateMeta.disk(str(self.context.weights_dir / f"v{version}"), version)

    def prepare(self, meta: WeightUpdateMeta) -> dict[str, float]:
        self.log.append(f"prepare {meta.version}")
        return {"perf/weight_pack_s": 0.25}

    def send(self, meta: WeightUpdateMeta) -> None:
        self.sending.set()
        self.log.append(f"send {meta.version}")

    def server_update(self, meta: WeightUpdateMeta) -> tuple[WeightUpdateMeta, None]:
        self.log.append(f"server_update {meta.version}")
        return meta, None

    def retire(self, meta: WeightUpdateMeta) -> None:
        self.log.append(f"retire {meta.version}")

    def close(self) -> None:
        self.log.append("close")

    @classmethod
    def receiver(cls, device: Any) -> Any:
        raise NotImplementedError


class WhilePaused(Recording):
    name: ClassVar[str] = "while_paused"
    sends_while_paused: ClassVar[bool] = True


class FakeExecutor:
    def __init__(self, transport_of: Any) -> None:
        self.transport_of = transport_of
        self.swaps: list[tuple[int, str]] = []

    def swap_weights(self, meta: WeightUpdateMeta, buckets: Any, version: int, mode: str) -> dict[str, float]:
        transport = self.transport_of()
        Recording.log.append(f"swap {version}")
        if transport.sends_while_paused:  # the servers receive while the trainer sends
            assert transport.sending.wait(WAIT_S), "the trainer did not send while the servers loaded"
        self.swaps.append((version, mode))
        return {"pause": 0.01, "transfer": 0.02, "resume": 0.03}


class CountingRollout:
    """``cfg.rollout``, counting the reads of ``weight_update``."""

    def __init__(self, mode: str) -> None:
        self._mode, self.reads, self.pause_mode = mode, 0, "in_place"

    @property
    def weight_update(self) -> str:
        self.reads += 1
        return self._mode


@pytest.fixture
def registered():
    Recording.built.clear()
    Recording.log.clear()
    for cls in (Recording, WhilePaused):
        WEIGHT_TRANSPORTS.register(cls.name, cls)
    yield
    for cls in (Recording, WhilePaused):
        WEIGHT_TRANSPORTS.unregister(cls.name)


@pytest.mark.parametrize("mode", ["recording", "while_paused"])
def test_the_transport_is_built_once_and_runs_the_shared_sequence(registered, mode: str, tmp_path: Path) -> None:
    rollout = CountingRollout(mode)
    versions: list[int] = []
    actor = SimpleNamespace(set_version=versions.append)
    executor = FakeExecutor(lambda: publisher.transport)
    side = SimpleNamespace(executor=executor, n_servers=2)
    publisher = WeightPublisher(SimpleNamespace(rollout=rollout), actor, side, tmp_path)  # type: ignore[arg-type]
    assert rollout.reads == 1
    (transport,) = Recording.built
    assert publisher.transport is transport and transport.name == mode
    assert transport.context == PublishContext(weights_dir=tmp_path / "weights", n_servers=2)

    for version in (1, 2):
        transport.sending.clear()
        parts = publisher.publish(version)
        assert set(parts) == {
            "perf/weight_update_s",
            "perf/servers_paused_s",
            "perf/weight_pack_s",
            "perf/weight_pause_s",
            "perf/weight_transfer_s",
            "perf/weight_resume_s",
        }
        assert parts["perf/weight_pack_s"] == 0.25 and parts["perf/weight_transfer_s"] == 0.02
        assert parts["perf/weight_update_s"] >= parts["perf/servers_paused_s"] >= 0
    assert Recording.built == [transport] and rollout.reads == 1  # chosen once, never looked up again
    assert versions == [1, 2] and executor.swaps == [(1, "in_place"), (2, "in_place")]
    for version in (1, 2):
        calls = [c for c in Recording.log if c.endswith(f" {version}")]
        if transport.sends_while_paused:  # the send runs during the swap; the swap is in another thread
            assert calls[:3] == [f"plan {version}", f"prepare {version}", f"server_update {version}"]
            assert set(calls[3:5]) == {f"swap {version}", f"send {version}"}
            assert calls[5:] == [f"retire {version}"]
        else:
            assert calls == [
                f"plan {version}",
                f"prepare {version}",
                f"send {version}",  # before the pause
                f"server_update {version}",
                f"swap {version}",
                f"retire {version}",
            ]
    publisher.close()
    publisher.close()
    assert Recording.log.count("close") == 1


def test_without_the_rollout_side_a_rank_only_sends(registered, tmp_path: Path) -> None:
    """A rank other than 0 (no rollout side) takes part in the send and sets the version: no
    server call, no retire."""
    versions: list[int] = []
    publisher = WeightPublisher(
        SimpleNamespace(rollout=CountingRollout("while_paused")),  # type: ignore[arg-type]
        SimpleNamespace(set_version=versions.append),
        None,
        tmp_path,
    )
    parts = publisher.publish(3)
    assert Recording.log == ["plan 3", "prepare 3", "send 3"] and versions == [3]
    assert set(parts) == {"perf/weight_update_s", "perf/servers_paused_s", "perf/weight_pack_s"}
    assert publisher.transport.context.n_servers == 0
