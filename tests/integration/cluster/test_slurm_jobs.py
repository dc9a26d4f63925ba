"""SlurmJobs against a real SLURM (``slurm_cluster``): batch jobs submitted from the login host.

Submit, look up by name, a second attempt after a failure, cancel (graceful, then forced), missing,
failed with the log tail, refusal while running, the script kept in the run directory with no
secret in it, and the preflight's refusals in SLURM's own words.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_tasks.api.jobs import JobStatus
from areal_tasks.config.cluster import ClusterConfig, SlurmConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.slurm.jobs import SlurmJobs
from areal_tasks.launch.slurm.preflight import preflight
from tests.fixtures.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

WAIT_S = 60.0
SECRET = "s3cr3t-value-never-in-files"

#: a job that records the secret it got through its environment, then waits for a file, then exits CODE
WAITER = """
import os, pathlib, signal, sys, time
out, trigger, code, on_term = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def term(signum, frame):
    print("got SIGTERM", flush=True)
    if on_term == "exit":
        sys.exit(5)
signal.signal(signal.SIGTERM, term if on_term != "default" else signal.SIG_DFL)
out.write_text(os.environ.get("MY_SECRET", "absent") + " " + os.environ.get("SLURM_JOB_ID", "?"))
print("job started", flush=True)
while not trigger.exists():
    time.sleep(0.05)
print("failing on purpose" if code else "done", flush=True)
sys.exit(code)
"""


def _jobs(cluster: SlurmCluster, root: Path, nodes: int = 1) -> SlurmJobs:
    slurm = SlurmConfig(slurm_conf=str(cluster.conf), partition=cluster.partition)
    return SlurmJobs(root, ClusterConfig(scheduler="slurm", nodes=nodes, slurm=slurm), label="test/slurm")


def _wait(jobs: SlurmJobs, name: str, states: tuple[str, ...]) -> JobStatus:
    deadline = time.monotonic() + WAIT_S
    while True:
        status = jobs.status(name)
        if status.state in states:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def _until(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_submit_lookup_retry_and_the_script_in_the_run_dir(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    jobs = _jobs(slurm_cluster, tmp_path / "jobs", nodes=2)
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    run_dir, trigger = tmp_path / "run", tmp_path / "trigger"
    argv = [sys.executable, str(script), str(tmp_path / "out1"), str(trigger), "3", "exit"]

    assert jobs.status("exp-t0").state == "missing"
    first = jobs.submit("exp-t0", argv, env={"MY_SECRET": SECRET}, run_dir=str(run_dir), cwd=str(tmp_path))
    assert first.state == "running" and first.attempt == 1 and first.backend == "slurm" and first.job_id
    _until(tmp_path / "out1")
    assert (tmp_path / "out1").read_text() == f"{SECRET} {first.job_id}"  # the env reached the job
    with pytest.raises(SchedulerError, match="already running"):
        jobs.submit("exp-t0", argv, run_dir=str(run_dir))
    shown = subprocess.run(
        ["scontrol", "show", "job", str(first.job_id), "-o"], env=slurm_cluster.env, capture_output=True, text=True
    )
    assert "NumNodes=2 " in shown.stdout and "Requeue=0 " in shown.stdout and "OverSubscribe=NO" in shown.stdout

    trigger.touch()
    failed = _wait(jobs, "exp-t0", ("failed",))
    assert failed.exit_code == 3 and "FAILED" in failed.reason and "failing on purpose" in failed.reason
    assert "failing on purpose" in jobs.log_tail("exp-t0")

    folder = tmp_path / "jobs" / "exp-t0" / "attempt_1"
    kept = run_dir / "slurm" / "attempt_1.sbatch"
    assert kept.read_text() == (folder / "job.sbatch").read_text()
    text = kept.read_text()
    assert "#SBATCH --nodes=2" in text and "--no-requeue" in text and "--exclusive" in text
    record = json.loads((folder / "job.json").read_text())
    assert record["job_id"] == first.job_id and record["env_keys"] == ["MY_SECRET"]
    for path in folder.iterdir():
        assert SECRET not in path.read_text(errors="replace"), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700

    argv[2] = str(tmp_path / "out2")
    second = jobs.submit("exp-t0", argv, env={"MY_SECRET": SECRET}, run_dir=str(run_dir))
    assert second.attempt == 2 and second.job_id != first.job_id
    done = _wait(jobs, "exp-t0", ("succeeded", "failed"))
    assert done.state == "failed" and done.attempt == 2  # the trigger is still there: fails at once
    assert (run_dir / "slurm" / "attempt_2.sbatch").is_file()


def test_succeeded_and_secret_on_the_command_line_refused(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    jobs = _jobs(slurm_cluster, tmp_path / "jobs")
    ok = jobs.submit("ok", [sys.executable, "-c", "print('hello from slurm')"], cwd=str(tmp_path))
    assert ok.state == "running"
    done = _wait(jobs, "ok", ("succeeded", "failed"))
    assert done.state == "succeeded" and done.exit_code == 0, done
    assert "hello from slurm" in jobs.log_tail("ok")
    with pytest.raises(SchedulerError, match="secret on its command line"):
        jobs.submit("leaky", [sys.executable, "-c", "pass", "--api-key", SECRET])


def test_cancel_graceful_then_forced(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    jobs = _jobs(slurm_cluster, tmp_path / "jobs")
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    never = tmp_path / "never"

    jobs.submit("graceful", [sys.executable, str(script), str(tmp_path / "g"), str(never), "0", "exit"])
    _until(tmp_path / "g")
    cancelled = jobs.cancel("graceful", grace_s=20.0)
    assert cancelled.state == "cancelled" and cancelled.exit_code == 5, cancelled  # its own SIGTERM handler ran
    assert "got SIGTERM" in jobs.log_tail("graceful")

    jobs.submit("stubborn", [sys.executable, str(script), str(tmp_path / "s"), str(never), "0", "ignore"])
    _until(tmp_path / "s")
    forced = jobs.cancel("stubborn", grace_s=1.0)  # SIGTERM ignored: scancel, SIGKILL after SLURM's KillWait
    assert forced.state == "cancelled", forced
    assert jobs.cancel("stubborn").state == "cancelled"  # nothing left to cancel
    assert jobs.cancel("absent").state == "missing"


INSIDE = """
import json, os, sys
from areal_tasks.api.scheduler import WorkerGroupSpec
from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.launch.slurm import SlurmScheduler
run_dir, conf, worker, out = sys.argv[1:5]
sched = SlurmScheduler(run_dir, slurm=SlurmConfig(slurm_conf=conf), handle_signals=False)
assert sched.job_id == os.environ["SLURM_JOB_ID"], sched.job_id
spec = WorkerGroupSpec(name="w", command=[sys.executable, worker, "dump", out + "-{rank}.json", "{host}"],
                       replicas=2, placement=[0, 1], ports_per_worker=0, torch_distributed=True)
sched.start_group(spec)
print("workers:", [w.status.value for w in sched.wait("w", timeout_s=60)], flush=True)
sched.stop_all()
"""


def test_a_batch_job_runs_its_workers_as_steps_of_its_own_allocation(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The path of ``areal train`` re-entered by the batch script: the scheduler uses the job's allocation."""
    jobs = _jobs(slurm_cluster, tmp_path / "jobs", nodes=2)
    worker = Path(__file__).parents[2] / "unit" / "launch" / "worker.py"
    out = tmp_path / "dump"
    argv = [sys.executable, "-c", INSIDE, str(tmp_path / "run"), str(slurm_cluster.conf), str(worker), str(out)]
    jobs.submit("inside", argv, cwd=str(Path.cwd()))
    done = _wait(jobs, "inside", ("succeeded", "failed"))
    assert done.state == "succeeded", jobs.log_tail("inside")
    assert "workers: ['succeeded', 'succeeded']" in jobs.log_tail("inside")
    dumps = [json.loads(Path(f"{out}-{rank}.json").read_text()) for rank in range(2)]
    addresses = [n.address for n in slurm_cluster.nodes]
    assert [d["argv"] for d in dumps] == [[addresses[0]], [addresses[1]]]
    assert {d["env"]["MASTER_ADDR"] for d in dumps} == {addresses[0]}
    assert [d["env"]["SLURM_JOB_ID"] for d in dumps] == [done.job_id] * 2


def test_the_hook_checks_resources_through_the_preflight(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from operators.exceptions import ArealAirflowError
    from operators.hooks.slurm_cluster import SlurmClusterHook

    monkeypatch.delenv("AIRFLOW_CONN_AREAL_SLURM", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    report = SlurmClusterHook(jobs_root=tmp_path, nodes=2).check_resources("embedded:d1+fsdp:d2")
    assert report["ok"] and report["partition"] == slurm_cluster.partition
    with pytest.raises(ArealAirflowError, match=r"cannot run this job.*refuses a job of 3 node"):
        SlurmClusterHook(jobs_root=tmp_path, nodes=3).check_resources("fsdp:d1")


def test_preflight_accepts_the_cluster_and_refuses_what_it_lacks(slurm_cluster: SlurmCluster) -> None:
    slurm = SlurmConfig(slurm_conf=str(slurm_cluster.conf), partition=slurm_cluster.partition)
    report = preflight(slurm, nodes=2)
    assert report["ok"] and report["partition"] == slurm_cluster.partition and report["sinfo"]
    default = preflight(SlurmConfig(slurm_conf=str(slurm_cluster.conf)), nodes=1)
    assert default["partition"] == slurm_cluster.partition
    with pytest.raises(SchedulerError, match="partition 'nosuch' does not exist"):
        preflight(SlurmConfig(slurm_conf=str(slurm_cluster.conf), partition="nosuch"))
    with pytest.raises(SchedulerError, match=r"refuses a job of 3 node\(s\).*Requested node configuration"):
        preflight(slurm, nodes=3)
