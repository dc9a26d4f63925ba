"""SlurmClusterHook: the ``areal_slurm`` connection, its defaults, and SchedulerError -> ArealAirflowError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operators.exceptions import ArealAirflowError
from operators.hooks.cluster import CLUSTER_HOOKS, get_cluster_hook
from operators.hooks.slurm_cluster import SlurmClusterHook

CONN_ENV = "AIRFLOW_CONN_AREAL_SLURM"


def test_registered_for_slurm(tmp_path: Path) -> None:
    assert CLUSTER_HOOKS["slurm"] is SlurmClusterHook
    hook = get_cluster_hook("slurm", jobs_root=str(tmp_path))
    assert isinstance(hook, SlurmClusterHook) and hook.conn_id == "areal_slurm"


def test_defaults_without_a_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONN_ENV, raising=False)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    hook = SlurmClusterHook(jobs_root=tmp_path / "jobs", nodes=2)
    settings = hook.settings()
    assert settings["slurm_conf"] == str(conf) and settings["jobs_root"] == str(tmp_path / "jobs")
    cluster = hook.cluster_config()
    assert cluster.scheduler == "slurm" and cluster.nodes == 2 and cluster.slurm.partition is None
    assert hook.get_conn().slurm_conf == str(conf)


def test_a_missing_slurm_conf_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONN_ENV, raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    with pytest.raises(ArealAirflowError, match=r"slurm.conf not found at .*absent.conf.*'slurm_conf'.*areal_slurm"):
        SlurmClusterHook(jobs_root=tmp_path).settings()


def test_the_connection_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "cluster.conf"
    conf.write_text("ClusterName=x\n")
    extra = {
        "slurm_conf": str(conf),
        "partition": "gpu",
        "account": "proj",
        "qos": "high",
        "python": "/opt/venv/bin/python",
        "workdir": "/srv/areal",
        "setup": "module load cuda\nsource /opt/venv/bin/activate",
        "jobs_root": str(tmp_path / "shared-jobs"),
    }
    monkeypatch.setenv(CONN_ENV, json.dumps({"conn_type": "generic", "extra": extra}))
    hook = SlurmClusterHook(jobs_root=tmp_path / "ignored")
    slurm = hook.cluster_config().slurm
    assert (slurm.partition, slurm.account, slurm.qos, slurm.python, slurm.workdir) == (
        "gpu",
        "proj",
        "high",
        "/opt/venv/bin/python",
        "/srv/areal",
    )
    assert slurm.setup == ["module load cuda", "source /opt/venv/bin/activate"] and slurm.slurm_conf == str(conf)
    assert hook.get_conn().root == tmp_path / "shared-jobs"
    monkeypatch.setenv(CONN_ENV, json.dumps({"conn_type": "generic", "extra": {"partiton": "gpu"}}))
    with pytest.raises(ArealAirflowError, match=r"unknown extra field\(s\) \['partiton'\]"):
        SlurmClusterHook(jobs_root=tmp_path).settings()


def test_scheduler_errors_become_airflow_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONN_ENV, raising=False)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    hook = SlurmClusterHook(jobs_root=tmp_path / "jobs")
    assert hook.get_job("never-submitted").state == "missing"
    with pytest.raises(ArealAirflowError, match="cannot look up SLURM job bad/name"):
        hook.get_job("bad/name")
    with pytest.raises(ArealAirflowError, match="allocation_mode 'fsdp:d2x' is not valid"):
        hook.check_resources("fsdp:d2x")


def test_the_training_operator_sizes_the_batch_job_by_the_job_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the DAG on SLURM with ``nodes=2``: the batch job asked for the hook's default of one
    node, so the job's storage probe (and its second train rank) had no second node."""
    from areal_tasks.api.jobs import JobStatus
    from areal_tasks.launch.slurm.jobs import SlurmJobs
    from operators.operators.training import AReaLTrainingOperator

    monkeypatch.delenv(CONN_ENV, raising=False)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    shapes: list[tuple[int, int, int | None]] = []

    def submit(self: SlurmJobs, name: str, argv: list[str], env=None, run_dir=None, *, cwd=None) -> JobStatus:
        shapes.append((self.cluster.nodes, self.cluster.gpus_per_node, self.cluster.cpus_per_node))
        return JobStatus(name, "running", "submitted", attempt=1, backend="slurm")

    monkeypatch.setattr(SlurmJobs, "submit", submit)
    hook = SlurmClusterHook(jobs_root=tmp_path / "jobs")
    operator = AReaLTrainingOperator(
        task_id="train",
        config="configs/demo_grpo.yaml",
        overrides=["cluster.scheduler=slurm", "cluster.nodes=2", "cluster.cpus_per_node=2"],
        jobs_root=str(tmp_path / "jobs"),
        run_dir=str(tmp_path / "run"),
        scheduler="slurm",
    )
    operator._submit(hook, "areal-job", recover=False)
    assert shapes == [(2, 0, 2)]
    assert hook.cluster_config().nodes == 2 and hook.cluster_config().slurm.slurm_conf == str(conf)
