"""``areal launch skypilot``: the task YAML's content, no secret in it, and SkyPilot's own parser accepts it.

The parser runs in ``.venv-sky`` (``make sky-env``; SkyPilot's pins do not fit the project's lock)
under a temporary HOME and, where ``unshare -n`` works, without any network. A malformed task proves
the parser is strict enough for the check to mean something.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from areal_tasks.config import load_config
from areal_tasks.errors import ConfigError
from areal_tasks.launch.registry import SCHEDULERS
from areal_tasks.launch.skypilot import STORAGE_MOUNT, render_task_yaml, skypilot_task

ROOT = Path(__file__).resolve().parents[3]
SKY_PY = ROOT / ".venv-sky" / "bin" / "python"
CONFIG = ROOT / "configs" / "demo_grpo.yaml"
SECRET = "Sup3rS3cretKeyValue"
OVERRIDES = [
    "cluster.nodes=2",
    "cluster.gpus_per_node=4",
    "cluster.cpus_per_node=16",
    "cluster.memory_gb_per_node=64",
    "cluster.skypilot.accelerator=H100",
    "cluster.skypilot.cloud=aws",
    "cluster.skypilot.region=us-east-1",
    "cluster.skypilot.use_spot=true",
    "cluster.skypilot.setup=['echo set up']",
    "storage.url=s3://areal-bucket/runs",
    "train.total_steps=320",
]


@pytest.fixture(autouse=True)
def ray_kind() -> Iterator[None]:
    """The task is validated as for the ray scheduler: stand one in while ray is not built here."""
    added = "ray" not in SCHEDULERS
    if added:
        SCHEDULERS.register("ray", "areal_tasks.launch.local:LocalScheduler")
    try:
        yield
    finally:
        if added:
            SCHEDULERS.unregister("ray")


def _task(overrides: list[str] = OVERRIDES, environ: dict[str, str] | None = None) -> dict[str, Any]:
    cfg = load_config(CONFIG, [*overrides, "cluster.scheduler=ray"], environ=environ or {})
    return skypilot_task(cfg, CONFIG, overrides)


def test_the_task_asks_for_the_nodes_resources_and_mounts_the_bucket() -> None:
    task = _task()
    assert task["name"] == "demo_grpo-trial0" and task["num_nodes"] == 2
    assert task["resources"] == {
        "cpus": "16+",
        "memory": "64+",
        "accelerators": "H100:4",
        "cloud": "aws",
        "region": "us-east-1",
        "use_spot": True,
    }
    assert task["workdir"] == str(ROOT)
    assert task["file_mounts"] == {STORAGE_MOUNT: {"source": "s3://areal-bucket/runs", "mode": "MOUNT"}}
    assert task["envs"]["AREAL_CONFIG"] == "configs/demo_grpo.yaml"
    assert task["secrets"] == {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AREAL_CONFIG_SECRETS": None}
    assert "echo set up" in task["setup"] and "pip install" in task["setup"]
    run = task["run"]
    assert "ray start --head --port=6379" in run and 'ray start --address="$HEAD:6379"' in run
    assert "ray stop" not in run.replace("never `ray stop`", "")
    train = next(line for line in run.splitlines() if "areal_tasks.cli train" in line)
    for part in (
        "train.total_steps=320",
        f"storage.url=file://{STORAGE_MOUNT}",
        "cluster.scheduler=ray",
        "cluster.ray.address=127.0.0.1:6379",
        'cluster.nodes="$SKYPILOT_NUM_NODES"',
    ):
        assert part in train, part
    assert train.index("storage.url=s3://") < train.index(f"storage.url=file://{STORAGE_MOUNT}")  # the mount wins


def test_no_secret_value_reaches_the_yaml() -> None:
    secrets = json.dumps({"storage.options.secret": SECRET, "tracking.mlflow_uri": f"https://u:{SECRET}@mlflow"})
    text = render_task_yaml(_task(environ={"AREAL_CONFIG_SECRETS": secrets}))
    assert SECRET not in text
    with pytest.raises(ConfigError, match="carry a secret.*--secret AREAL_CONFIG_SECRETS"):
        _task([*OVERRIDES, f"storage.options.secret={SECRET}"])


def test_gpus_need_an_accelerator_type() -> None:
    with pytest.raises(ConfigError, match=r"cluster.skypilot.accelerator: required with cluster.gpus_per_node=4"):
        _task([o for o in OVERRIDES if "accelerator" not in o])


def test_skypilot_own_ray_ports_are_refused_and_not_the_default() -> None:
    cfg = load_config(CONFIG, ["cluster.scheduler=ray"])
    assert cfg.cluster.skypilot.ray_port not in (6380, 8266)
    with pytest.raises(ConfigError, match="taken by SkyPilot's own Ray"):
        load_config(CONFIG, ["cluster.scheduler=ray", "cluster.skypilot.ray_port=6380"])


def test_the_cli_writes_the_task(tmp_path: Path) -> None:
    from areal_tasks.cli import main

    out = tmp_path / "task.yaml"
    assert main(["launch", "skypilot", "--config", str(CONFIG), *OVERRIDES, "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["num_nodes"] == 2


def _parse_with_skypilot(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if not SKY_PY.exists():
        pytest.skip("SkyPilot's parser is not installed: run `make sky-env` (builds .venv-sky)")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    code = (
        "import json, sys, sky\n"
        "t = sky.Task.from_yaml(sys.argv[1])\n"
        "r = list(t.resources)[0]\n"
        "print(json.dumps({'num_nodes': t.num_nodes, 'cloud': str(r.cloud), 'region': r.region,"
        " 'accelerators': r.accelerators, 'cpus': r.cpus, 'memory': r.memory, 'use_spot': r.use_spot,"
        " 'secrets': [s.name for s in t.managed_secret_refs], 'mounts': sorted(t.storage_mounts)}))\n"
    )
    argv = [str(SKY_PY), "-c", code, str(path)]
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        argv = [unshare, "-n", *argv]  # no network at all: the parse must not need one
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_skypilot_parses_the_task(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(render_task_yaml(_task()))
    result = _parse_with_skypilot(path, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["num_nodes"] == 2
    assert parsed["cloud"] == "AWS" and parsed["region"] == "us-east-1" and parsed["use_spot"] is True
    assert parsed["accelerators"] == {"H100": 4} and parsed["cpus"] == "16+" and parsed["memory"] == "64+"
    assert parsed["secrets"] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AREAL_CONFIG_SECRETS"]
    assert parsed["mounts"] == [STORAGE_MOUNT]


def test_skypilot_rejects_a_malformed_task(tmp_path: Path) -> None:
    """The same check fails on a bad field: the parser does validate what we write."""
    task = _task()
    task["num_nodes"] = "two"
    task["resoures"] = task.pop("resources")
    path = tmp_path / "bad.yaml"
    path.write_text(render_task_yaml(task))
    result = _parse_with_skypilot(path, tmp_path)
    assert result.returncode != 0
    assert "resoures" in result.stderr or "num_nodes" in result.stderr, result.stderr[-2000:]
