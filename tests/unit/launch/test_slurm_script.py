"""The SLURM backend's pure parts: the batch script and srun lines, the output parsers, the state mapping.

Pyxis and apptainer are not packaged in Debian, so their container lines are checked here by
rendering only.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.slurm.commands import parse_key_values, parse_rows, resolve_slurm_conf
from areal_tasks.launch.slurm.jobs import _exit_code, map_state
from areal_tasks.launch.slurm.script import (
    BatchScript,
    container_wrapping,
    render_batch_script,
    srun_step_argv,
    train_command,
)

ATTEMPT = Path("/jobs/exp-t0/attempt_2")


def _script(**overrides) -> str:
    fields = {
        "name": "exp-t0",
        "attempt": 2,
        "attempt_dir": ATTEMPT,
        "command": train_command("/venv/bin/python", "/cfg/rl.yaml", ["rl.steps=3"]),
        "workdir": "/repo",
        "nodes": 2,
        "label": "exp/t0",
    }
    fields.update(overrides)
    return render_batch_script(BatchScript(**fields))


def _sbatch_lines(text: str) -> list[str]:
    return [
        line.split("#", 2)[1].removeprefix("SBATCH ").strip()
        for line in text.splitlines()
        if line.startswith("#SBATCH")
    ]


def test_the_default_script_asks_for_whole_nodes_without_requeue() -> None:
    text = _script()
    assert text.startswith("#!/bin/bash\n# areal job exp-t0, attempt 2")
    opts = _sbatch_lines(text)
    assert opts[:4] == ["--job-name=exp-t0", "--nodes=2", "--ntasks-per-node=1", "--exclusive"]
    assert "--no-requeue" in opts and f"--output={ATTEMPT}/job.log" in opts and "--chdir=/repo" in opts
    assert not any(o.startswith(("--gres", "--partition", "--account", "--qos", "--time", "--mem")) for o in opts)
    assert text.rstrip().endswith(
        "/venv/bin/python -m areal_tasks.cli train --config /cfg/rl.yaml rl.steps=3 cluster.scheduler=slurm"
    )
    assert f"mv -f {ATTEMPT}/.exit_code.tmp {ATTEMPT}/exit_code" in text and "EXIT" in text


def test_gres_resources_and_the_slurm_section() -> None:
    slurm = SlurmConfig(
        partition="gpu",
        account="proj",
        qos="high",
        time_limit="2-00:00:00",
        exclusive=False,
        requeue=True,
        setup=["module load cuda", "source /venv/bin/activate"],
        sbatch_args=["--constraint=h100"],
    )
    text = _script(gpus_per_node=4, cpus_per_node=16, memory_gb_per_node=64, slurm=slurm)
    opts = _sbatch_lines(text)
    for option in (
        "--gres=gpu:4",
        "--cpus-per-task=16",
        "--mem=65536M",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--time=2-00:00:00",
        "--constraint=h100",
    ):
        assert option in opts, option
    assert "--exclusive" not in opts and "--no-requeue" not in opts
    body = text.split("# cluster.slurm.setup\n", 1)[1]
    assert body.startswith("module load cuda\nsource /venv/bin/activate\n")


def test_the_script_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n"], input=_script(), text=True, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr


def test_no_secret_goes_into_the_script() -> None:
    with pytest.raises(SchedulerError, match="secret on its command line.*environment"):
        _script(command=["/venv/bin/python", "-m", "x", "--api-key", "sk-live-123"])
    with pytest.raises(SchedulerError, match="secret"):
        _script(command=["python", "-m", "areal_tasks.cli", "train", "storage.options.secret=abc"])


def test_container_lines_for_pyxis_and_apptainer() -> None:
    pyxis = SlurmConfig(container_image="nvcr.io/areal:1", container_mounts=["/data:/data"])
    options, prefix = container_wrapping(pyxis, "/runs/x", cwd="/repo")
    assert (
        options
        == [
            "--container-image=nvcr.io/areal:1",
            "--container-mounts=/runs/x:/runs/x,/data:/data",
            "--container-workdir=/repo",
        ]
        and prefix == []
    )
    apptainer = SlurmConfig(container_image="/img/areal.sif", container_runtime="apptainer")
    options, prefix = container_wrapping(apptainer, "/runs/x", gpus=1)
    assert options == [] and prefix == ["apptainer", "exec", "--nv", "--bind", "/runs/x:/runs/x", "/img/areal.sif"]
    assert container_wrapping(SlurmConfig(), "/runs/x") == ([], [])
    assert "# Worker steps run in /img/areal.sif (apptainer)" in _script(slurm=apptainer)


def test_the_srun_line_of_a_worker() -> None:
    argv = srun_step_argv(
        job_id="42",
        node="n1",
        name="actor-1",
        log_path="/runs/x/logs/actor/1.log",
        argv=["python", "train.py"],
        cpus=0.5,
        gpus=2,
        cwd="/repo",
        container=container_wrapping(SlurmConfig(container_image="/i.sif", container_runtime="apptainer"), "/runs/x"),
    )
    assert argv[:7] == [
        "srun",
        "--jobid=42",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n1",
        "--cpus-per-task=1",
    ]
    assert "--gpus-per-task=2" in argv and "--kill-on-bad-exit=1" in argv and "--export=ALL" in argv
    assert "--job-name=actor-1" in argv and "--output=/runs/x/logs/actor/1.log" in argv
    assert argv[-8:] == [
        "--chdir=/repo",
        "apptainer",
        "exec",
        "--bind",
        "/runs/x:/runs/x",
        "/i.sif",
        "python",
        "train.py",
    ]


def test_scontrol_and_squeue_parsers() -> None:
    line = (
        "NodeName=ar0n1 Arch=x86_64 CPUTot=2 Gres=gpu:a100:4(S:0-1) NodeAddr=10.231.0.11 "
        "OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC State=IDLE AllocTRES=cpu=2,mem=4000M Reason=Not responding [root@x]"
    )
    fields = parse_key_values(line)
    assert fields["NodeAddr"] == "10.231.0.11" and fields["CPUTot"] == "2" and fields["Gres"] == "gpu:a100:4(S:0-1)"
    assert fields["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC" and fields["AllocTRES"] == "cpu=2,mem=4000M"
    assert fields["Reason"] == "Not responding [root@x]"
    rows = parse_rows("12|RUNNING|None\n\n13|PENDING|Resources|odd\n", ("id", "state", "reason"))
    assert rows == [
        {"id": "12", "state": "RUNNING", "reason": "None"},
        {"id": "13", "state": "PENDING", "reason": "Resources|odd"},
    ]


@pytest.mark.parametrize(
    ("slurm_state", "cancelled", "state"),
    [
        ("PENDING", False, "running"),
        ("CONFIGURING", False, "running"),
        ("RUNNING", True, "running"),
        ("COMPLETING", False, "running"),
        ("SUSPENDED", False, "running"),
        ("COMPLETED", False, "succeeded"),
        ("FAILED", False, "failed"),
        ("TIMEOUT", False, "failed"),
        ("NODE_FAIL", False, "failed"),
        ("OUT_OF_MEMORY", False, "failed"),
        ("BOOT_FAIL", False, "failed"),
        ("DEADLINE", False, "failed"),
        ("CANCELLED", False, "cancelled"),
        ("CANCELLED by 0", False, "cancelled"),
        ("FAILED", True, "cancelled"),
        ("NODE_FAIL", True, "cancelled"),
    ],
)
def test_slurm_states_map_to_job_states(slurm_state: str, cancelled: bool, state: str) -> None:
    assert map_state(slurm_state, cancelled) == state


def test_exit_codes_from_scontrol() -> None:
    assert _exit_code("7:0") == 7 and _exit_code("0:15") == 143 and _exit_code("") is None


def test_a_missing_slurm_conf_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SchedulerError, match=r"slurm.conf not found at /nope/slurm.conf.*DNS"):
        resolve_slurm_conf("/nope/slurm.conf")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert resolve_slurm_conf(None) == str(conf)


def test_class_level_contract_from_a_job_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """from_config builds without touching SLURM; the controller runs here only inside a SLURM job."""
    from areal_tasks.config.job import JobConfig
    from areal_tasks.launch.slurm import SlurmScheduler
    from areal_tasks.launch.slurm.jobs import SlurmJobs

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    cfg = JobConfig()
    cfg.experiment.run_dir = str(tmp_path / "runs" / "exp" / "t0")
    cfg.cluster.scheduler, cfg.cluster.nodes, cfg.cluster.slurm.slurm_conf = "slurm", 2, str(conf)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("AREAL_JOBS_ROOT", raising=False)
    sched = SlurmScheduler.from_config(cfg)
    assert sched.allocation.known_id is None and sched.allocation.n_nodes == 2 and sched.slurm_conf == str(conf)
    assert not SlurmScheduler.can_run_controller_here(cfg)
    jobs = SlurmJobs.from_config(cfg)
    assert jobs.root == tmp_path / "runs" / "exp" / "jobs" and jobs.cluster.nodes == 2
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert SlurmScheduler.can_run_controller_here(cfg)
    assert SlurmScheduler.from_config(cfg).allocation.known_id == "77"
