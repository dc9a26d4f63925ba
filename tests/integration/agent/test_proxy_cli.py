"""``areal proxy`` end to end: a subprocess on a tiny job config (its embedded server started through
the job's scheduler), the admin key from the environment, one session (start, chat with the SDK,
reward, end), its group read back over HTTP and from ``--export-dir``; SIGTERM stops the proxy and
the servers it started. Every wait is bounded."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
START_S = 300.0
STOP_S = 60.0


def _lines(stream, sink: queue.Queue) -> None:
    for line in stream:
        sink.put(line)


def test_areal_proxy_serves_a_session_and_stops_its_servers_on_sigterm(tmp_path: Path, tiny_qwen2: Path) -> None:
    env = {**os.environ, "PROXY_ADMIN_KEY": "cli-admin-key", "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "proxy",
        "--config",
        str(REPO / "configs" / "demo_grpo.yaml"),
        f"experiment.run_dir={tmp_path / 'run'}",
        f"model.path={tiny_qwen2}",
        "allocation=embedded:d1+fsdp:d1",
        "--port",
        "0",
        "--admin-api-key-env",
        "PROXY_ADMIN_KEY",
        "--export-dir",
        str(tmp_path / "export"),
    ]
    log = (tmp_path / "proxy.log").open("w")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        deadline = time.monotonic() + START_S
        url = None
        while url is None:
            assert process.poll() is None, (tmp_path / "proxy.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "areal proxy did not start"
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line.startswith("areal proxy serving on "):
                url = line.split()[-1]
        servers = psutil.Process(process.pid).children(recursive=True)
        assert servers, "the proxy started no inference server"
        admin = {"Authorization": "Bearer cli-admin-key"}
        assert httpx.post(f"{url}/rl/start_session", timeout=30).status_code == 401
        session = httpx.post(f"{url}/rl/start_session", headers=admin, timeout=30).json()
        client = openai.OpenAI(base_url=url + "/v1", api_key=session["api_key"], max_retries=0, timeout=120)
        answer = client.chat.completions.create(model="areal", messages=[{"role": "user", "content": "Hi"}])
        key = {"Authorization": f"Bearer {session['api_key']}"}
        reward = httpx.post(f"{url}/rl/set_reward", json={"reward": 1.0}, headers=key, timeout=30).json()
        assert reward["completion_id"] == answer.id
        assert httpx.post(f"{url}/rl/end_session", headers=key, timeout=60).status_code == 200
        group = httpx.get(f"{url}/rl/groups/next", params={"timeout": 30}, headers=admin, timeout=60).json()
        assert group["session_id"] == session["session_id"] and group["rewards"] == [1.0]
        exported = [json.loads(line) for line in (tmp_path / "export" / "groups.jsonl").read_text().splitlines()]
        assert [g["session_id"] for g in exported] == [session["session_id"]]
        assert exported[0]["trajectories"] == group["trajectories"]

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_S) == 0
        _, alive = psutil.wait_procs(servers, timeout=STOP_S)
        assert not alive, f"inference servers still running after the proxy stopped: {alive}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_S)
        log.close()
