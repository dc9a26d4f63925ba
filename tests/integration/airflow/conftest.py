"""Session fixtures of the live-server Airflow tests: ONE MLflow server and ONE ``airflow standalone``.

Every test in this folder shares them (``live_servers``, launched together: Airflow only needs
MLflow's URI, known before MLflow serves). The standalone runs the repo's ``dags/`` on SQLite with
the LocalExecutor and parallelism 4; it reaches MLflow through the Airflow connection
``areal_mlflow`` (a stray ``MLFLOW_TRACKING_URI`` is not inherited); the DAGs' retry knobs are small
(``AREAL_DAG_RETRIES=1``, ``AREAL_DAG_RETRY_DELAY_S=2``); run directories and training-job records
go under the session's tmp dir (``AREAL_RUNS_DIR``, ``AREAL_JOBS_ROOT``). Start-up takes 25-60 s on
2 cores; the timings are printed (``-s``). At the end of the session any training job still running
is cancelled through its job record, then Airflow and MLflow are stopped by PID, and the teardown
fails if a process started under the standalone's ``AIRFLOW_HOME`` is still alive.

``rest_run`` is the session's one training run (triggered over REST, its training worker killed
once): test_rest_trigger.py and test_retry.py read different sides of it, so the DAG trains once.

The tests carry the ``airflow`` marker: ``pytest -m "not airflow"`` skips them.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.airflow_server import (
    AirflowClient,
    AirflowStandalone,
    RestRun,
    cancel_running_jobs,
    cmdline,
    complete_checkpoints,
    descendants,
    job_records,
    pid_alive,
    wait_for,
)
from tests.fixtures.mlflow_server import MlflowServer

REPO_ROOT = Path(__file__).resolve().parents[3]
DAG_ID = "areal_rl_training"
#: retries of every task in these tests (the retry test needs one) and the first retry's delay.
DAG_RETRIES = 1
DAG_RETRY_DELAY_S = 2


@pytest.fixture(scope="session")
def airflow_runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$AREAL_RUNS_DIR`` of the standalone: DAG runs' run directories (and job records) go here."""
    return tmp_path_factory.mktemp("airflow-runs")


@pytest.fixture(scope="session")
def live_servers(
    airflow_runs_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[MlflowServer, AirflowStandalone]]:
    """MLflow and Airflow, launched together (Airflow only needs MLflow's URI, known before it serves)."""
    pytest.importorskip("mlflow", reason="mlflow is not installed: pip install -e '.[tracking]'")
    pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")
    mlflow_server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    env = {
        "AREAL_DAG_RETRIES": str(DAG_RETRIES),
        "AREAL_DAG_RETRY_DELAY_S": str(DAG_RETRY_DELAY_S),
        "AREAL_JOB_POLL_INTERVAL_S": "2",  # a finished job is noticed within 2 s, not 10
        "AREAL_RUNS_DIR": str(airflow_runs_dir),
        "AREAL_JOBS_ROOT": str(airflow_runs_dir / "jobs"),
        "AREAL_PROJECT_DIR": str(REPO_ROOT),
    }
    airflow_server = AirflowStandalone(
        tmp_path_factory.mktemp("airflow-standalone"),
        dags_folder=REPO_ROOT / "dags",
        env=env,
        wait_for_dags=[DAG_ID],
        unset_env=["MLFLOW_TRACKING_URI"],
    )
    try:
        mlflow_server.launch()
        # the MLflow hook's connection (its first choice after a Param); the trainer gets the URI from it
        connection = {"conn_type": "generic", "host": mlflow_server.tracking_uri}
        airflow_server.extra_env["AIRFLOW_CONN_AREAL_MLFLOW"] = json.dumps(connection)
        airflow_server.launch()
        mlflow_server.wait_ready()
        airflow_server.wait_ready()
        t = airflow_server.timings
        print(
            f"\n[live_servers] Airflow {airflow_server.base_url} (pid {airflow_server.pid}): "
            f"API up {t['api_s']:.1f}s, all components healthy {t['healthy_s']:.1f}s, "
            f"{DAG_ID} parsed {t['dags_s']:.1f}s; "
            f"MLflow {mlflow_server.tracking_uri} (pid {mlflow_server.pid}) ready in {mlflow_server.startup_s:.1f}s"
        )
        yield mlflow_server, airflow_server
    finally:
        try:
            cancelled = cancel_running_jobs(airflow_runs_dir)
            if cancelled:
                print(f"\n[live_servers] cancelled training jobs still running at the end: {cancelled}")
        finally:
            try:
                airflow_server.stop()
            finally:
                mlflow_server.stop()


@pytest.fixture(scope="session")
def mlflow_server(live_servers: tuple[MlflowServer, AirflowStandalone]) -> MlflowServer:
    """The session's MLflow tracking server (the one Airflow's connection ``areal_mlflow`` points at)."""
    return live_servers[0]


@pytest.fixture(scope="session")
def airflow_server(live_servers: tuple[MlflowServer, AirflowStandalone]) -> AirflowStandalone:
    """The session's ``airflow standalone``, with ``areal_rl_training`` parsed and unpaused."""
    return live_servers[1]


@pytest.fixture(scope="session")
def airflow(airflow_server: AirflowStandalone) -> Iterator[AirflowClient]:
    """A REST client of the session's Airflow, logged in as admin."""
    client = airflow_server.client()
    try:
        yield client
    finally:
        client.close()


# ------------------------------------------------------------------ the shared DAG run

SFT_STEPS = 4
RL_STEPS = 20
SAVE_EVERY = 4
RUN_TIMEOUT_S = 900.0


@pytest.fixture(scope="session")
def rest_run(airflow: AirflowClient, airflow_runs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> RestRun:
    """ONE tiny ``areal_rl_training`` run triggered over REST, whose training worker is killed once.

    Two test files read it (one run serves both, instead of two): test_rest_trigger.py
    checks what the REST trigger produced (XCom, MLflow run, registry, summary), test_retry.py how
    the kill was survived. The conf: the demo recipe with 4 SFT warm-start steps and 20 short RL
    steps at batch 16 (2 prompts x 8 samples), a checkpoint every 4 RL steps, 8 eval prompts
    sampled once, checkpoints in a tmp ``storage_url``, a fresh experiment and registered model.

    As soon as the job has a complete checkpoint, the process group of one of its RL train workers
    (a descendant of the job's wrapper pid, from the job record, running
    ``areal_tasks.trainer.rl_worker``) gets SIGKILL; nothing else is touched. The fixture then
    waits for the run to end (success or not: the tests assert, with the run's report).
    """
    tag = uuid.uuid4().hex[:8]
    storage = tmp_path_factory.mktemp("rest-run-storage")
    experiment, model_name, run_id = f"it-rest-{tag}", f"it-rest-policy-{tag}", f"rest_{tag}"
    conf: dict[str, Any] = {
        "config": "configs/demo_grpo.yaml",
        "experiment_name": experiment,
        "registered_model_name": model_name,
        "storage_url": storage.as_uri(),
        "sft_steps": SFT_STEPS,
        "max_steps": SFT_STEPS + RL_STEPS,
        "eval_prompts": 8,
        "extra_overrides": ["train.batch_size=16", "evaluation.n_samples=1", f"saver.freq_steps={SAVE_EVERY}"],
    }
    started = time.monotonic()
    created = airflow.trigger(DAG_ID, conf, run_id=run_id)

    def first_attempt() -> dict[str, Any] | None:
        records = [r for r in job_records(airflow_runs_dir) if run_id in r["name"] and r["attempt"] == 1]
        if not records and (state := airflow.dag_run(DAG_ID, run_id)["state"]) in ("success", "failed"):
            report = airflow.run_report(DAG_ID, run_id)
            raise AssertionError(f"the run ended ({state}) before its training job was submitted\n{report}")
        return records[0] if records else None

    record = wait_for(first_attempt, 600, f"the training job of {run_id} to be submitted", poll_s=1.0)
    wrapper = int(record["pid"])

    def checkpoint_while_running() -> list[int] | None:
        if not pid_alive(wrapper):
            log = (Path(record["attempt_dir"]) / "job.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"job {record['name']} ended before it wrote a checkpoint to kill after:\n{log}")
        return complete_checkpoints(storage) or None

    saved = wait_for(checkpoint_while_running, 600, f"a checkpoint of job {record['name']}", poll_s=0.2)
    workers = [pid for pid in descendants(wrapper) if "areal_tasks.trainer.rl_worker" in cmdline(pid)]
    assert workers, f"no RL train worker among the descendants of job pid {wrapper}"
    victim = min(workers)
    os.killpg(os.getpgid(victim), signal.SIGKILL)
    print(f"\n[rest_run] killed RL worker pid {victim} at {time.monotonic() - started:.1f}s; checkpoints: {saved}")

    final = airflow.wait_for_run(DAG_ID, run_id, timeout_s=RUN_TIMEOUT_S)
    seconds = time.monotonic() - started
    print(f"[rest_run] DAG run {run_id}: {final['state']} in {seconds:.1f}s")
    return RestRun(
        run_id=run_id,
        conf=conf,
        storage=storage,
        experiment=experiment,
        model_name=model_name,
        sft_steps=SFT_STEPS,
        rl_steps=RL_STEPS,
        save_every=SAVE_EVERY,
        created=created,
        final=final,
        job_name=record["name"],
        killed_pid=victim,
        checkpoints_at_kill=saved,
        seconds=seconds,
    )
