"""The contract every registered weight transport passes, end to end between two processes.

The trainer's side runs here on one rank, as the publisher runs it (plan, prepare, send before the
pause or while the servers load, the servers' meta and bucket plan, retire, close), over a tiny
:class:`~areal_tasks.api.weights.WeightSource` whose fp32 master weights are published in bf16; a
server process (``transport_harness.py``) receives with the mode's receiver from what the servers
are sent alone. It gets every tensor exactly, in the served dtype; the same update checked against a
served model that has one weight in another shape is refused, the message naming that weight.
A new transport is registered, and this test runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from areal_tasks.weights.base import PublishContext
from areal_tasks.weights.registry import WEIGHT_TRANSPORTS, transport_class

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from transport_harness import TinySource, publish, published, served_specs  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("mode", WEIGHT_TRANSPORTS.names())
def test_the_server_receives_exactly_the_published_weights(mode: str, tmp_path: Path) -> None:
    source = TinySource(seed=3)
    transport = transport_class(mode)(source, PublishContext(tmp_path / "weights", n_servers=1))
    assert transport.name == mode
    try:
        got = publish(transport, 1, tmp_path, served_specs(source.tensors))
    finally:
        transport.close()
    assert "error" not in got, got.get("error")
    received = got["tensors"]
    assert set(received) == set(source.tensors)
    for name, master in source.tensors.items():
        expected = published(master)
        assert received[name].dtype == expected.dtype and torch.equal(received[name], expected), name


@pytest.mark.parametrize("mode", WEIGHT_TRANSPORTS.names())
def test_a_weight_of_another_shape_than_served_is_refused_by_name(mode: str, tmp_path: Path) -> None:
    source = TinySource(seed=4)
    transport = transport_class(mode)(source, PublishContext(tmp_path / "weights", n_servers=1))
    try:
        got = publish(transport, 1, tmp_path, served_specs(source.tensors, reshape="layers.0.proj.weight"))
    finally:
        transport.close()
    assert "tensors" not in got
    assert "layers.0.proj.weight" in got["error"] and "shape mismatch" in got["error"], got["error"]


def test_the_disk_transport_keeps_only_the_newest_directories(tmp_path: Path) -> None:
    """``retire`` after each update: the directories of older versions go, the newest two stay."""
    from areal_tasks.weights.disk import KEEP_WEIGHT_DIRS

    source = TinySource(seed=5)
    transport = transport_class("disk")(source, PublishContext(tmp_path / "weights", n_servers=1))
    for version in (1, 2, 3):
        publish(transport, version, tmp_path, served_specs(source.tensors))
    kept = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert KEEP_WEIGHT_DIRS == 2 and kept == ["v2", "v3"]
