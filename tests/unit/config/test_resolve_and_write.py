"""Run directory resolution, storage URL default, resolved-config round trip and hash stability."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from areal_tasks.config import (
    JobConfig,
    config_hash,
    config_to_dict,
    dump_config_yaml,
    load_config,
    write_resolved,
)
from areal_tasks.errors import ConfigError


def test_run_dir_default_is_absolute_under_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["experiment.name=exp", "experiment.trial=t1"])
    assert cfg.experiment.run_dir == str(tmp_path / "runs" / "exp" / "t1")
    assert cfg.storage.url == f"file://{tmp_path}/runs/exp/t1/storage"


def test_relative_run_dir_is_made_absolute_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "job.yaml").write_text("experiment: {run_dir: out/../here}\n", encoding="utf-8")
    cfg = load_config(tmp_path / "conf" / "job.yaml")
    assert cfg.experiment.run_dir == str(tmp_path / "here")
    assert os.path.isabs(cfg.experiment.run_dir)


def test_explicit_storage_url_is_kept(tmp_path: Path) -> None:
    cfg = load_config(None, [f"experiment.run_dir={tmp_path}", "storage.url=s3://bucket/prefix"])
    assert cfg.experiment.run_dir == str(tmp_path)
    assert cfg.storage.url == "s3://bucket/prefix"


def test_write_resolved_round_trip(tmp_path: Path) -> None:
    overrides = [
        f"experiment.run_dir={tmp_path / 'run'}",
        "algorithm.name=dapo",
        "rollout.sampling.stop=['1e-6', 'true']",
        "storage.options={key: 'null', n: 2}",
        "ref.optimizer.lr=3e-7",
        "actor.lora.target_modules=[q]",
    ]
    cfg = load_config(None, overrides)
    path = write_resolved(cfg)
    assert path == tmp_path / "run" / "config.yaml"
    assert path.read_text(encoding="utf-8").startswith(
        f"# resolved configuration written by areal-tasks; config_hash: {config_hash(cfg)}"
    )
    again = load_config(path)
    assert again == cfg
    assert config_hash(again) == config_hash(cfg)
    assert write_resolved(again) == path  # rewriting the same config is fine


def test_write_resolved_needs_a_resolved_run_dir() -> None:
    with pytest.raises(ConfigError, match="experiment.run_dir: must be an absolute path"):
        write_resolved(JobConfig())


def test_write_resolved_reports_unwritable_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    cfg = load_config(None, [f"experiment.run_dir={blocker / 'sub'}"])
    with pytest.raises(ConfigError, match="experiment.run_dir: cannot write"):
        write_resolved(cfg)


def test_hash_is_stable_and_sensitive(tmp_path: Path) -> None:
    base = [f"experiment.run_dir={tmp_path}"]
    first = config_hash(load_config(None, base))
    assert first == config_hash(load_config(None, base))
    assert len(first) == 12 and int(first, 16) >= 0
    assert config_hash(load_config(None, [*base, "actor.optimizer.lr=2e-6"])) != first


def test_dict_and_yaml_follow_field_order() -> None:
    cfg = load_config()
    assert list(config_to_dict(cfg))[:4] == ["experiment", "cluster", "storage", "allocation"]
    assert dump_config_yaml(cfg).startswith("experiment:\n  name: areal\n")
