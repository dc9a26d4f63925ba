"""Checkpoints on a real S3 server (SeaweedFS): save, incremental references, prune, load identical,
partial saves ignored, the CLI on s3:// URLs, damage caught on S3 (list, verify, a recovery that
falls back and quarantines), and a 2-rank FSDP run saved on S3, stopped and resumed bit-identically
to a straight run."""

from __future__ import annotations

import json

import pytest
import torch

from areal_tasks.checkpoint.layout import COMPLETE_MARKER
from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.cli import main
from areal_tasks.config.sections import SaverConfig
from storage.testing.seaweed import SeaweedS3Server
from tests.unit.checkpoint.toy_engine import ToyEngine

pytestmark = pytest.mark.integration


def _use_env(monkeypatch: pytest.MonkeyPatch, server: SeaweedS3Server) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)


def test_s3_round_trip_incremental_prune_and_cli(s3_server, s3_bucket, tmp_path, monkeypatch, capsys):
    url = f"s3://{s3_bucket}/runs"
    manager = CheckpointManager(url, s3_server.storage_options(), "exp", "t0", SaverConfig(keep_last=1))
    engine = ToyEngine(seed=0)
    for step in (1, 2, 3):
        engine.train_step()
        manager.save(step, {"actor": engine}, TrainerState(step=step, dataloader={"i": step}), {"loss": 1.0}).wait()
    meta = manager.metadata(3)
    assert meta.references and meta.sizes.referenced >= engine.model[0].weight.numel() * 4
    assert [(i.step, i.status) for i in manager.list()] == [(1, "data"), (3, "complete")]
    storage = manager.layout.storage
    storage.write_bytes("step_4/dcp/rank-00000.distcp", b"a save killed midway")
    assert manager.latest() == 3

    fresh = ToyEngine(seed=99)
    state = manager.recover("auto", {"actor": fresh})
    assert state.step == 3 and state.dataloader == {"i": 3}
    assert all(torch.equal(v, engine.params()[k]) for k, v in fresh.params().items())
    assert manager.prune().delete == ["step_4"] and storage.walk_files("step_4") == {}
    assert [(i.step, i.status) for i in manager.list()] == [(1, "data"), (3, "complete")]
    assert not storage.exists(f"step_1/{COMPLETE_MARKER}") and storage.exists("step_1/dcp/rank-00000.distcp")

    _use_env(monkeypatch, s3_server)
    assert main(["checkpoint", "list", manager.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latest"] == 3
    assert main(["checkpoint", "inspect", f"{manager.url}/step_3"]) == 0
    assert json.loads(capsys.readouterr().out)["parent"] == 2


def test_s3_damage_is_caught_and_recovery_falls_back(s3_server, s3_bucket, monkeypatch, capsys):
    url = f"s3://{s3_bucket}/damage"
    manager = CheckpointManager(url, s3_server.storage_options(), "exp", "t0", SaverConfig(keep_last=5))
    engine = ToyEngine(seed=0)
    for step in (1, 2):
        engine.train_step()
        manager.save(step, {"actor": engine}, TrainerState(step=step), {"loss": 1.0}).wait()
    storage = manager.layout.storage
    index = json.loads(storage.read_text("step_2/dcp/index.json"))
    record = next(i for i in index["items"] if i["fqn"] == "engines.actor.model.1.weight" and i["dir"] == "step_2")
    data = bytearray(storage.read_bytes("step_2/dcp/rank-00000.distcp"))
    data[record["pos"]] ^= 0xFF
    storage.write_bytes("step_2/dcp/rank-00000.distcp", bytes(data))

    _use_env(monkeypatch, s3_server)
    assert main(["checkpoint", "list", manager.url, "--verify", "--json"]) == 0
    statuses = {row["step"]: row["status"] for row in json.loads(capsys.readouterr().out)["checkpoints"]}
    assert statuses == {1: "complete", 2: "corrupt"}
    assert main(["checkpoint", "verify", manager.url]) == 2
    err = capsys.readouterr().err
    assert "engines.actor.model.1.weight" in err and f"s3://{s3_bucket}/damage" in err

    fresh = ToyEngine(seed=99)
    resumer = CheckpointManager(url, s3_server.storage_options(), "exp", "t0", SaverConfig(keep_last=5))
    assert resumer.recover("auto", {"actor": fresh}).step == 1
    assert [(i.step, i.status) for i in resumer.list()] == [(1, "complete"), (2, "quarantined")]
    resumer.save(2, {"actor": fresh}, TrainerState(step=2), {"loss": 1.0}).wait()
    assert [(i.step, i.status) for i in resumer.list(deep=True)] == [(1, "complete"), (2, "complete")]


@pytest.mark.distributed
def test_fsdp_save_on_s3_and_resume_is_exact(s3_server, s3_bucket, tmp_path, tiny_qwen2, monkeypatch):
    from launch import run_workers

    _use_env(monkeypatch, s3_server)  # the workers inherit the credentials and endpoint
    common = {"model_dir": str(tiny_qwen2), "steps": 2, "save_every": 1}
    url = f"s3://{s3_bucket}/runs"
    calls = [
        ["train_run", {**common, "url": f"file://{tmp_path}/straight", "tag": "straight"}],
        ["train_run", {**common, "url": url, "tag": "first", "stop_at": 1}],  # a job that stops after step 1
        ["train_run", {**common, "url": url, "tag": "resumed"}],  # a new engine and manager resume it
    ]
    run_workers("workers_checkpoint:sequence", 2, tmp_path, {"calls": calls})
    straight = torch.load(tmp_path / "straight.pt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    assert resumed["resumed_from"] == 1 and resumed["listing"] == [(1, "complete"), (2, "complete")]
    assert resumed["metrics"][2] == straight["metrics"][2]
    for name, tensor in straight["params"].items():
        assert torch.equal(tensor, resumed["params"][name]), name
    for name, entry in straight["optim"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, resumed["optim"]["state"][name][key]), f"{key} of {name}"
