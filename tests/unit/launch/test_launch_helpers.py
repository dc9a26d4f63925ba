"""Pure helpers of the launch layer: placeholders, spec validation, ports, devices, probes, factory."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import ReadinessCheck, WorkerGroupSpec, expand_placeholders
from areal_tasks.errors import ConfigError, SchedulerError
from areal_tasks.launch import LocalScheduler, make_scheduler
from areal_tasks.launch.devices import DevicePool
from areal_tasks.launch.ports import PortAllocator
from areal_tasks.launch.readiness import probe


def test_expand_placeholders_replaces_known_names_only() -> None:
    values = {"port": 8000, "port_1": 8001, "rank": 2, "host": "127.0.0.1"}
    text = "http://{host}:{port}/{rank} {port_1} {other} {'a': 1} {{port}}"
    assert expand_placeholders(text, values) == "http://127.0.0.1:8000/2 8001 {other} {'a': 1} {8000}"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "bad name"}, "name"),
        ({"command": []}, "command"),
        ({"replicas": 0}, "replicas"),
        ({"ports_per_worker": -1}, "ports_per_worker"),
        ({"devices_per_worker": -2}, "devices_per_worker"),
        ({"ready_timeout_s": 0}, "ready_timeout_s"),
        ({"ports_per_worker": 0, "readiness": ReadinessCheck.http()}, "ports_per_worker"),
    ],
)
def test_spec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"name": "g", "command": ["true"]}
    with pytest.raises(ConfigError, match=field):
        WorkerGroupSpec(**{**base, **kwargs})  # type: ignore[arg-type]


def test_readiness_check_validation() -> None:
    with pytest.raises(ConfigError, match="http"):
        ReadinessCheck(kind="http", target="localhost:80/health")
    with pytest.raises(ConfigError, match="path template"):
        ReadinessCheck(kind="file")
    with pytest.raises(ConfigError, match="kind"):
        ReadinessCheck(kind="tcp")  # type: ignore[arg-type]


def test_port_allocator_never_hands_out_a_held_port() -> None:
    allocator = PortAllocator()
    first = allocator.allocate(5)
    second = allocator.allocate(5)
    assert len(set(first) | set(second)) == 10
    for port in first:  # free when handed out: binding works
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    allocator.release(first)
    assert allocator.held == frozenset(second)


def test_device_pool_acquire_release_keeps_order() -> None:
    pool = DevicePool(["0", "1", "2"])
    a = pool.acquire(2, "w/0")
    assert a == ["0", "1"] and pool.free == ["2"]
    with pytest.raises(SchedulerError, match="w/1 needs 2 device"):
        pool.acquire(2, "w/1")
    pool.release(a)
    assert pool.free == ["0", "1", "2"]


@pytest.fixture
def http_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None  # keep test output quiet

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_http_probe(http_server: int) -> None:
    assert probe("http", f"http://127.0.0.1:{http_server}/health").ready
    busy = probe("http", f"http://127.0.0.1:{http_server}/busy")
    assert not busy.ready and "503, expected 200" in busy.detail
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
        closed = probe("http", f"http://127.0.0.1:{sock.getsockname()[1]}/health", timeout_s=1.0)
    assert not closed.ready and "refused" in closed.detail.lower()


def test_file_probe(tmp_path: Path) -> None:
    marker = tmp_path / "m"
    assert not probe("file", str(marker)).ready
    marker.touch()
    assert probe("file", str(marker)).ready


def test_make_scheduler(tmp_path: Path) -> None:
    sched = make_scheduler("local", run_dir=tmp_path, devices=[], handle_signals=False)
    assert isinstance(sched, LocalScheduler)
    with pytest.raises(SchedulerError, match=r"'skypilot' is a launcher.*supported schedulers: local, ray, slurm"):
        make_scheduler("skypilot")
    with pytest.raises(SchedulerError, match="supported schedulers: local"):
        make_scheduler("kubernetes")
