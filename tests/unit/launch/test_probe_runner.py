"""``SchedulerProbeRunner``: one probe worker per node of the scheduler (placement 0..N-1, 0.1 CPU),
outcomes named by the scheduler's nodes; too few nodes is refused naming them; the local one-machine
fallback (``emulate_nodes``); and ``preflight_storage`` wired into ``run_train`` before anything starts."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.errors import SchedulerError
from areal_tasks.launch import LocalScheduler
from areal_tasks.launch.probe_runner import PROBE_CPUS, SchedulerProbeRunner, preflight_storage
from tests.fixtures.two_nodes_scheduler import TwoNodes

ECHO = [sys.executable, "-c", "import os, sys; print('rank', sys.argv[1], os.environ['AREAL_NODE_ADDR'])", "{rank}"]


def test_one_worker_per_node_named_by_the_scheduler(tmp_path: Path) -> None:
    with TwoNodes(tmp_path, devices=[], handle_signals=False) as scheduler:
        runner = SchedulerProbeRunner(scheduler)
        spec = runner.spec(ECHO, 2, {"X": "1"})
        assert spec.placement == [0, 1] and spec.cpus_per_worker == PROBE_CPUS == 0.1
        assert spec.hide_devices and spec.ports_per_worker == 0 and spec.env == {"X": "1"}
        outcomes = runner.run_on_nodes(ECHO, 2, {}, timeout_s=60)
    assert [(o.node, o.exit_code, o.host) for o in outcomes] == [(0, 0, "n0, 127.0.0.1"), (1, 0, "n1, 127.0.0.2")]
    assert [o.output.strip() for o in outcomes] == ["rank 0 127.0.0.1", "rank 1 127.0.0.2"]


def test_more_probe_nodes_than_the_scheduler_has_is_refused(tmp_path: Path) -> None:
    with (
        LocalScheduler(tmp_path, devices=[], handle_signals=False) as scheduler,
        pytest.raises(SchedulerError, match=r"needs 3 nodes, but the scheduler has 1 \(node 0 \("),
    ):
        SchedulerProbeRunner(scheduler).spec(ECHO, 3, {})


def test_the_local_fallback_plays_the_nodes_with_processes_on_node_0(tmp_path: Path) -> None:
    with LocalScheduler(tmp_path, devices=[], handle_signals=False) as scheduler:
        runner = SchedulerProbeRunner(scheduler, emulate_nodes=True)
        assert runner.spec(ECHO, 3, {}).placement is None
        outcomes = runner.run_on_nodes(ECHO, 3, {}, timeout_s=60)
    assert [(o.node, o.exit_code, o.host) for o in outcomes] == [(0, 0, None), (1, 0, None), (2, 0, None)]


def test_preflight_is_a_no_op_on_one_node(tmp_path: Path) -> None:
    cfg = load_config(None, [f"experiment.run_dir={tmp_path / 'run'}"])
    with LocalScheduler(tmp_path, devices=[], handle_signals=False) as scheduler:
        assert preflight_storage(cfg, scheduler) == []
        assert not (tmp_path / "logs").exists()  # no probe group started


def test_run_train_probes_the_storage_of_a_multi_node_job_before_it_starts(tmp_path: Path) -> None:
    from areal_tasks.trainer.rl import run_train

    cfg = load_config(None, [f"experiment.run_dir={tmp_path / 'run'}"])
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, nodes=2))
    with LocalScheduler(tmp_path / "sched", devices=[], handle_signals=False) as scheduler:
        with pytest.raises(SchedulerError, match="the storage probe needs 2 nodes"):
            run_train(cfg, scheduler)
        logs = tmp_path / "sched" / "logs"
        assert not logs.exists() or all(p.name.startswith("storage-probe-") for p in logs.iterdir())
