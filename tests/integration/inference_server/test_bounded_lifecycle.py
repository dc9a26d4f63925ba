"""A real ``areal serve`` process under hostile admin calls: bounded, never wedged, never left paused.

* Group set-ups to a listener that accepts and never answers (a "blackhole"): the first answers
  504 after its deadline, the next ones 409 at once; ``/health`` answers 503 naming the stuck call;
  generation and a disk update still run; and
  SIGTERM ends the process within ``--shutdown-timeout-s`` although a thread is stuck in the
  rendezvous (it used to outlive SIGTERM, joined at exit).
* Loads of bad weights (garbage safetensors, an index without ``weight_map``, an index entry out of
  the directory, a directory outside the weight roots, a shared-memory "buffer" that is
  ``/etc/passwd``) answer 400 through ``/areal/swap_weights`` and the plain routes; the server is
  not left paused and serves on at the old version.

Loopback only; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from embedded_server import _log_tail, running_process

from areal_tasks.models.safetensors_dir import INDEX_FILE

pytestmark = pytest.mark.integration

ADMIN_ENV, ADMIN_KEY = "AREAL_TEST_LIFECYCLE_ADMIN_KEY", "lifecycle-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SHUTDOWN_S = 3
GENERATE = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """A loopback listener that accepts every connection and never sends a byte; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


@contextlib.contextmanager
def serving(tiny_qwen2: Path, log: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ADMIN_ENV, ADMIN_KEY)  # as a job hands it over: through the environment
        with running_process(tiny_qwen2, log, "--admin-api-key-env", ADMIN_ENV, *args) as served:
            yield served


def init_group(http: httpx.Client, port: int, name: str) -> httpx.Response:
    body = {
        "master_address": "127.0.0.1",
        "master_port": port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": name,
        "backend": "gloo",
    }
    return http.post("/init_weights_update_group", json=body, headers=ADMIN)


def test_hung_group_set_ups_are_bounded_and_sigterm_still_stops_the_server(tiny_qwen2: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    args = ("--weight-group-timeout-s", "1", "--shutdown-timeout-s", str(SHUTDOWN_S))
    with blackhole() as port, serving(tiny_qwen2, log, *args) as (url, proc):
        with httpx.Client(base_url=url, timeout=60.0) as http:
            first = init_group(http, port, "g0")
            assert first.status_code == 504, first.text
            assert first.json() == {
                "success": False,
                "message": f"init_weights_update_group(g0 at 127.0.0.1:{port}) did not finish within 6 s",
            }
            for i in range(1, 7):  # the groups lane's thread is stuck in the rendezvous: refused, not queued
                refused = init_group(http, port, f"g{i}")
                assert refused.status_code == 409 and "another weight operation" in refused.json()["message"]
            assert http.post("/generate", json=GENERATE).status_code == 200
            # the stuck rendezvous holds the groups lane past its deadline: /health says so (503 with
            # the reason), so a fleet restarts this server, the only way to free that thread
            health = http.get("/health")
            assert health.status_code == 503 and "groups: " in health.text, health.text
            version = http.get("/get_model_info").json()["weight_version"]
            loaded = http.post("/update_weights_from_disk", json={"model_path": str(tiny_qwen2)}, headers=ADMIN)
            assert loaded.status_code == 200, loaded.text
            assert http.get("/get_model_info").json()["weight_version"] == str(int(version) + 1)
        os.kill(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=SHUTDOWN_S + 15)  # the bound, plus process start-up slack
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server outlived SIGTERM:\n{_log_tail(log)}") from None
        assert code in (0, 128 + signal.SIGTERM), _log_tail(log)
        assert "not waited for: areal-groups" in log.read_text() or code == 128 + signal.SIGTERM


def _bad_weights(root: Path) -> dict[str, Path]:
    garbage, no_map, escape = root / "garbage", root / "no-map", root / "escape"
    for path in (garbage, no_map, escape):
        path.mkdir(parents=True)
    (garbage / "model.safetensors").write_bytes(os.urandom(4096))
    (no_map / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    (escape / INDEX_FILE).write_text(json.dumps({"weight_map": {"x": "../garbage/model.safetensors"}}))
    return {"garbage": garbage, "no-map": no_map, "escape": escape}


def test_bad_weights_answer_400_and_leave_the_server_serving(tiny_qwen2: Path, tmp_path: Path) -> None:
    bad = _bad_weights(tmp_path / "roots")
    outside = tmp_path / "outside"
    outside.mkdir()
    args = ("--weight-root", str(tmp_path / "roots"))
    with (
        serving(tiny_qwen2, tmp_path / "server.log", *args) as (url, _),
        httpx.Client(base_url=url, timeout=60.0) as http,
    ):
        version = http.get("/get_model_info").json()["weight_version"]
        messages = {}
        for name, path in [*bad.items(), ("outside", outside), ("missing", tmp_path / "nothing")]:
            for route, body in (
                ("/areal/swap_weights", {"model_path": str(path), "mode": "abort"}),
                ("/update_weights_from_disk", {"model_path": str(path)}),
            ):
                answer = http.post(route, json=body, headers=ADMIN)
                assert answer.status_code == 400 and answer.json()["success"] is False, (route, answer.text)
                messages[name] = answer.json()["message"]
            info = http.get("/server_info").json()
            assert info["paused"] is None and info["weight_version"] == version, name
            assert http.post("/generate", json=GENERATE).status_code == 200
        # outside the roots reads like missing: the messages differ only by the path sent
        assert messages["outside"].replace(str(outside), "P") == messages["missing"].replace(
            str(tmp_path / "nothing"), "P"
        )
        assert "No such file" not in messages["missing"] and "weight_map" in messages["no-map"]
        shared = {
            "shared_buffers": [{"kind": "file", "id": "x", "nbytes": 64, "path": "/etc/passwd"}],
            "names": ["lm_head.weight"],
            "dtypes": ["float32"],
            "shapes": [[4, 4]],
        }
        answer = http.post("/areal/update_weights_from_shared", json=shared, headers=ADMIN)
        assert answer.status_code == 400 and "not an areal weight buffer" in answer.json()["message"]
        assert http.get("/get_model_info").json()["weight_version"] == version
