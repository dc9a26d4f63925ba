"""The storage and cluster hooks on this machine: storage pre-flight passing on a writable path and
failing in seconds (without retries) on a bad URL or an unusable path, checkpoint listing, the
local resource check and the refusal of scheduler kinds that do not exist yet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from areal_tasks.launch.jobs import LocalJobs
from operators.exceptions import ArealAirflowError, ArealConfigError
from operators.hooks.cluster import LocalClusterHook, get_cluster_hook
from operators.hooks.storage import StorageHook


def test_storage_validate_passes_on_a_writable_dir(tmp_path: Path) -> None:
    report = StorageHook(str(tmp_path / "store")).validate(min_free_gb=None)
    assert report["ok"] and report["kind"] == "file"
    assert {c["check"] for c in report["checks"]} >= {"local.path", "storage.round_trip"}
    assert (tmp_path / "store").is_dir()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://example.com/x", "misconfigured"),  # a scheme storage does not support
        ("FILE_IS_HERE/sub", "failed its pre-flight checks:\n- local.path"),  # a path below a regular file
    ],
)
def test_storage_validate_fails_fast_and_clearly(tmp_path: Path, url: str, match: str) -> None:
    blocker = tmp_path / "FILE_IS_HERE"
    blocker.write_text("not a directory")
    started = time.monotonic()
    with pytest.raises(ArealConfigError, match=match) as info:
        StorageHook(url.replace("FILE_IS_HERE", str(blocker))).validate()
    assert time.monotonic() - started < 10
    assert isinstance(info.value, AirflowFailException)  # a misconfiguration is not retried
    if "pre-flight" in match:
        assert "fix:" in str(info.value)


def test_storage_hook_needs_a_url() -> None:
    with pytest.raises(ArealAirflowError, match="needs a storage URL"):
        StorageHook("")


def test_list_checkpoints_lists_complete_ones_in_step_order(tmp_path: Path) -> None:
    folder = tmp_path / "exp" / "t0" / "checkpoints"
    for step, complete in ((20, True), (3, True), (40, False)):
        (folder / f"step_{step}").mkdir(parents=True)
        (folder / f"step_{step}" / "metadata.json").write_text("{}")
        if complete:
            (folder / f"step_{step}" / "_COMPLETE").write_text("{}")
    expected = [(folder / "step_3").as_uri(), (folder / "step_20").as_uri()]
    assert StorageHook(str(tmp_path)).list_checkpoints("exp", "t0") == expected
    assert StorageHook(folder.as_uri()).list_checkpoints() == expected
    assert StorageHook(str(tmp_path)).list_checkpoints("other", "t0") == []
    with pytest.raises(ArealAirflowError, match="both experiment and trial"):
        StorageHook(str(tmp_path)).list_checkpoints("exp")


def test_local_resources_fit_a_cpu_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report = LocalClusterHook(tmp_path).check_resources("embedded:d1+fsdp:d2", n_gpus=0, min_memory_gb=0.01)
    assert report["ok"] and report["processes"] == 3 and report["gpus_needed"] == 0
    assert report["ports_checked"] == 2 and report["cpus"] >= 1 and report["memory_available_gb"] > 0


def test_local_resources_report_every_shortage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ArealAirflowError) as info:
        LocalClusterHook(tmp_path).check_resources("sglang:d2+fsdp:d4", n_gpus=4, min_memory_gb=1e9)
    message = str(info.value)
    assert "needs 6 GPUs but n_gpus=4" in message
    assert "this machine shows 0" in message
    assert "GB of memory available, 1000000000.0 GB required" in message


def test_bad_allocation_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ArealAirflowError, match="allocation_mode 'fsdp:d2x' is not valid"):
        LocalClusterHook(tmp_path).check_resources("fsdp:d2x")


@pytest.mark.parametrize(
    ("kind", "match"),
    [("skypilot", "a launcher, not a scheduler"), ("k8s", "unknown")],
)
def test_other_schedulers_are_refused_with_the_supported_list(kind: str, match: str) -> None:
    with pytest.raises(ArealAirflowError, match=rf"'{kind}' .*{match}.*supported schedulers: local"):
        get_cluster_hook(kind, jobs_root="/tmp/x")


def test_every_built_scheduler_kind_has_a_cluster_hook() -> None:
    """The hooks are registered per kind here; which kinds exist comes from the launch registry."""
    from areal_tasks.launch.registry import scheduler_kinds
    from operators.hooks.cluster import CLUSTER_HOOKS

    assert set(CLUSTER_HOOKS) == set(scheduler_kinds())
    assert all(hook.scheduler == kind for kind, hook in CLUSTER_HOOKS.items())


def test_local_hook_wraps_job_errors(tmp_path: Path) -> None:
    hook = get_cluster_hook("local", jobs_root=str(tmp_path / "jobs"))
    assert isinstance(hook, LocalClusterHook) and isinstance(hook.get_conn(), LocalJobs)
    assert hook.get_job("absent").state == "missing"
    with pytest.raises(ArealAirflowError, match="cannot look up job bad/name"):
        hook.get_job("bad/name")
    with pytest.raises(ArealAirflowError, match="cannot submit job x: .*argv is empty"):
        hook.submit_job("x", [])


def test_a_connection_id_is_refused_by_a_hook_that_takes_none(tmp_path: Path) -> None:
    with pytest.raises(ArealAirflowError, match=r"takes no Airflow connection, but conn_id='x' was given"):
        get_cluster_hook("local", jobs_root=tmp_path, conn_id="x")


def test_ray_hook_defaults_without_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``areal_ray`` connection: the dashboard from $RAY_API_SERVER_ADDRESS, else loopback; no token."""
    import sys

    from operators.hooks.ray_cluster import RayClusterHook

    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    hook = get_cluster_hook("ray", jobs_root="/tmp/unused")
    assert isinstance(hook, RayClusterHook) and hook.ray_conn_id == "areal_ray"
    conn = hook.connection
    assert (conn.url, conn.token, conn.python, conn.request_timeout_s) == (
        "http://127.0.0.1:8265",
        None,
        sys.executable,
        30.0,
    )
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://head:8265")
    assert RayClusterHook().get_conn().url == "http://head:8265"


def test_ray_hook_reads_the_connection_and_masks_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from operators.hooks.ray_cluster import RayClusterHook

    extra = {"python": "/opt/venv/bin/python", "workdir": "/srv/proj", "env": {"HF_HOME": "/data/hf"}}
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_RAY",
        json.dumps(
            {"conn_type": "http", "host": "head", "port": 8266, "schema": "https", "password": "t0k", "extra": extra}
        ),
    )
    masked: list[str] = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", masked.append)
    hook = RayClusterHook(ray_conn_id="my_ray")
    conn = hook.connection
    assert (conn.url, conn.token, conn.python, conn.workdir) == (
        "https://head:8266",
        "t0k",
        "/opt/venv/bin/python",
        "/srv/proj",
    )
    assert conn.env == {"HF_HOME": "/data/hf"} and "t0k" in masked
    jobs = hook.get_conn()
    assert jobs.dashboard.token == "t0k" and jobs.workdir == "/srv/proj"


def test_ray_hook_turns_scheduler_errors_into_airflow_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from operators.hooks.ray_cluster import RayClusterHook

    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:9")
    hook = RayClusterHook()
    hook.get_conn().dashboard.timeout_s = 2
    with pytest.raises(ArealAirflowError, match="cannot look up job j: .*unreachable"):
        hook.get_job("j")
    with pytest.raises(ArealAirflowError, match="allocation_mode 'fsdp:d2x' is not valid"):
        hook.check_resources("fsdp:d2x")
