"""Session fixtures of the live-server Airflow tests: ONE MLflow server and ONE ``airflow standalone``.

Every test in this folder that asks for ``airflow_server`` shares the same standalone (the repo's
``dags/``, SQLite, LocalExecutor, parallelism 4) wired to the same real MLflow tracking server
(``MLFLOW_TRACKING_URI`` and the Airflow connection ``areal_mlflow`` both point at it), with the
DAGs' retry knobs small (``AREAL_DAG_RETRIES=1``, ``AREAL_DAG_RETRY_DELAY_S=2``) and run
directories under the session's tmp dir (``AREAL_RUNS_DIR``). Start-up takes ~25-60 s on 2 cores;
the timings are printed. At the end of the session any training job still running is cancelled
(through its job record), then Airflow and MLflow are stopped by PID and the fixture fails if a
process started under its ``AIRFLOW_HOME`` is still alive.

The tests carry the ``airflow`` marker: ``pytest -m "not airflow"`` skips them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.airflow_server import AirflowClient, AirflowStandalone, cancel_running_jobs
from tests.fixtures.mlflow_server import MlflowServer, mlflow_server  # noqa: F401 (the session fixture)

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
def airflow_server(
    mlflow_server: MlflowServer,  # noqa: F811 (the fixture imported above)
    airflow_runs_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AirflowStandalone]:
    """A running ``airflow standalone`` with ``areal_rl_training`` parsed and unpaused."""
    pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")
    env = {
        "AREAL_DAG_RETRIES": str(DAG_RETRIES),
        "AREAL_DAG_RETRY_DELAY_S": str(DAG_RETRY_DELAY_S),
        "AREAL_RUNS_DIR": str(airflow_runs_dir),
        "AREAL_PROJECT_DIR": str(REPO_ROOT),
        "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "AIRFLOW_CONN_AREAL_MLFLOW": json.dumps({"conn_type": "generic", "host": mlflow_server.tracking_uri}),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    server = AirflowStandalone(
        tmp_path_factory.mktemp("airflow-standalone"), dags_folder=REPO_ROOT / "dags", env=env, wait_for_dags=[DAG_ID]
    )
    server.start()
    t = server.timings
    print(
        f"\n[airflow_server] {server.base_url} (pid {server.pid}): API up {t['api_s']:.1f}s, all components "
        f"healthy {t['healthy_s']:.1f}s, {DAG_ID} parsed {t['dags_s']:.1f}s; MLflow {mlflow_server.tracking_uri} "
        f"started in {mlflow_server.startup_s:.1f}s"
    )
    try:
        yield server
    finally:
        try:
            cancel_running_jobs(airflow_runs_dir)
        finally:
            server.stop()


@pytest.fixture(scope="session")
def airflow(airflow_server: AirflowStandalone) -> Iterator[AirflowClient]:
    """A REST client of the session's Airflow, logged in as admin."""
    client = airflow_server.client()
    try:
        yield client
    finally:
        client.close()

