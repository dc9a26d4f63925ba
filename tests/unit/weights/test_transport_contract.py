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

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from areal_tasks.weights.base import PublishContext, WeightTransport
from areal_tasks.weights.registry import WEIGHT_TRANSPORTS, transport_class

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from transport_harness import TinySource, published, served_specs  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _publish(transport: WeightTransport, version: int, tmp_path: Path, served: dict) -> dict:
    """One update of ``version``: the trainer's sequence here, the server's in another process."""
    meta = transport.plan(version)
    parts = transport.prepare(meta)
    assert all(k.startswith("perf/") and v >= 0 for k, v in parts.items()), parts
    if not transport.sends_while_paused:
        transport.send(meta)
    server_meta, buckets = transport.server_update(meta)
    request = tmp_path / f"request-{version}.json"
    result = tmp_path / f"result-{version}.pt"
    request.write_text(
        json.dumps(
            {
                "mode": transport.name,
                "meta": server_meta.to_dict(),
                "buckets": None
                if buckets is None
                else [[[s.name, s.dtype, list(s.shape)] for s in b] for b in buckets],
                "served": served,
            }
        )
    )
    server = subprocess.Popen([sys.executable, str(HERE / "transport_harness.py"), str(request), str(result)])
    sender_error: list[BaseException] = []
    if transport.sends_while_paused:  # the servers receive while the trainer sends

        def send() -> None:
            try:
                transport.send(meta)
            except BaseException as exc:  # noqa: BLE001 - reported below
                sender_error.append(exc)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the trainer's send did not finish"
    assert server.wait(timeout=180) == 0, "the server process failed"
    assert not sender_error, sender_error
    transport.retire(meta)
    return torch.load(result, weights_only=False)


@pytest.mark.parametrize("mode", WEIGHT_TRANSPORTS.names())
def test_the_server_receives_exactly_the_published_weights(mode: str, tmp_path: Path) -> None:
    source = TinySource(seed=3)
    transport = transport_class(mode)(source, PublishContext(tmp_path / "weights", n_servers=1))
    assert transport.name == mode
    try:
        got = _publish(transport, 1, tmp_path, served_specs(source.tensors))
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
        got = _publish(transport, 1, tmp_path, served_specs(source.tensors, reshape="layers.0.proj.weight"))
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
        _publish(transport, version, tmp_path, served_specs(source.tensors))
    kept = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert KEEP_WEIGHT_DIRS == 2 and kept == ["v2", "v3"]
