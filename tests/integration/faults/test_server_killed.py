"""An inference server SIGKILLed mid-rollout (issue #26, item 7).

A tiny RL job with two embedded servers and one train rank (eta 0, per-sample seeds, batches in
data order, EOS ignored so no group is rejected). The first server to decode with the weights of
version 2 (step 3's rollout) freezes at a fault point with its requests running, and the test
SIGKILLs its whole process group: a deterministic moment, whatever the machine's speed. The client
must reroute the requests that were on it (and the weight update go on without the dead server),
the fleet must restart it, and the run must finish all its steps having trained on exactly the
episodes an unfaulted run trains on: with eta 0 and no rejected group step ``k`` trains on the
groups of the prompts ``k`` of the data order, each sample once (``rollout_episodes.jsonl``).

So that the restarted server's return is seen whatever the machine's speed, rank 0 holds at a fault
point in step 4 (``pause``, before its update) until the fleet has published the restarted server's
address; released, its next weight update gives the restarted server the current weights and the
last steps' episodes are served by it too.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from areal_tasks.api.faults import FAULTS_ENV
from areal_tasks.config import load_config
from areal_tasks.datasets.registry import load_split
from areal_tasks.rollout.data_source import DataSource
from areal_tasks.rollout.servers import read_server_list
from tests.fixtures.faults import (
    CONFIG,
    DETERMINISTIC,
    REPO,
    TrainJob,
    episode_ids_by_step,
    episode_servers_by_step,
    metrics_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

STEPS = 6
OVERRIDES = [
    *[o for o in DETERMINISTIC if not o.startswith(("rollout.server.extra_args", "rollout.sampling.max_new_tokens"))],
    "allocation=embedded:d2+fsdp:d1",
    "rollout.sampling.max_new_tokens=32",
    "rollout.sampling.ignore_eos=true",
    f"train.total_steps={STEPS}",
    "saver.freq_steps=100",
]


def _expected_ids(run_dir: Path) -> dict[int, list[list[int]]]:
    cfg = load_config(str(REPO / CONFIG), [*OVERRIDES, f"experiment.run_dir={run_dir}"])
    order = DataSource(load_split(cfg.dataset, "train"), seed=cfg.experiment.seed, shuffle=cfg.dataset.shuffle).order(0)
    groups = cfg.train.batch_size // cfg.rollout.group_size
    return {
        step: [[0, order[(step - 1) * groups + g], j] for g in range(groups) for j in range(cfg.rollout.group_size)]
        for step in range(1, STEPS + 1)
    }


def _servers(controller: int) -> dict[int, int]:
    """``port -> pid`` of the embedded servers the controller started (they lead sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    found, todo = {}, [controller]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and b"--port" in argv:
                found[int(argv[argv.index(b"--port") + 1])] = pid
    return found


def _wait(predicate, timeout_s: float, what: str, job: TrainJob, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert job.proc is not None and job.proc.poll() is None, f"the job ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}:\n{job.log_tail()}"
        time.sleep(poll_s)


def test_server_killed_mid_rollout_loses_no_episode(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    hold, frozen = tmp_path / "hold", tmp_path / "frozen"
    faults = [
        f"server.decode:version=2:action=pause:once={frozen}",
        f"rl.step.before_update:rank=0:step=4:action=pause:once={hold}",
    ]
    with TrainJob(run_dir, OVERRIDES, {FAULTS_ENV: ";".join(faults)}) as job:
        assert job.proc is not None
        reached = Path(f"{frozen}.reached")
        pid = int(_wait(lambda: reached.is_file() and reached.read_text().strip(), 300, "a server in step 3", job, 0.1))
        servers = _servers(job.proc.pid)
        assert len(servers) == 2 and pid in servers.values(), servers
        port = next(p for p, q in servers.items() if q == pid)
        servers_before = [f"127.0.0.1:{p}" for p in servers]
        os.killpg(pid, signal.SIGKILL)  # the server leads a session of its own
        killed_at = time.monotonic()
        restarted = _wait(
            lambda: "restarted" in job.log_path.read_text(errors="replace"), 120, "the fleet's restart", job, 0.2
        )
        restart_s = time.monotonic() - killed_at
        assert restarted
        _wait((run_dir / "inference_servers.json").is_file, 30, "the published addresses", job, 0.2)
        _wait(lambda: Path(f"{hold}.reached").is_file(), 120, "rank 0 holding in step 4", job, 0.2)
        Path(f"{hold}.release").touch()
        assert job.wait(300) == 0, job.log_tail()
        finished_s = time.monotonic() - killed_at

    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    logged = episode_ids_by_step(run_dir)
    flat = [tuple(e) for step in sorted(logged) for e in logged[step]]
    assert len(flat) == len(set(flat)), "an episode was trained twice"
    assert logged == _expected_ids(run_dir), "the trained episodes differ from an unfaulted run's"
    rank0 = (run_dir / "logs" / "rl" / "0.log").read_text(errors="replace")
    assert f"127.0.0.1:{port}" in rank0 and "retry" in rank0, "no request was rerouted from the killed server"
    restarted_at = next(a for a in read_server_list(run_dir / "inference_servers.json") if a not in servers_before)
    assert "the fleet's servers changed" in rank0
    served = episode_servers_by_step(run_dir)
    assert any(restarted_at in s for step in (5, 6) for s in served[step]), served
    print(
        f"[fault-timing] server SIGKILLed mid-rollout: restart seen {restart_s:.1f} s after the kill; the run "
        f"finished its {STEPS} steps {finished_s:.1f} s after the kill (rank 0 held in step 4 until the restart)"
    )
