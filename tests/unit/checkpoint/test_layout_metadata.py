"""Layout names, metadata JSON round trip and the config record (hash equals the run's config hash)."""

from __future__ import annotations

import pytest

from areal_tasks.checkpoint.layout import checkpoints_key, parse_step_dir, step_dir
from areal_tasks.checkpoint.metadata import ByteCounts, CheckpointMetadata, FileInfo, config_payload
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.errors import CheckpointError


def test_step_directories_and_run_key():
    assert step_dir(40) == "step_40" and parse_step_dir("step_40") == 40
    assert parse_step_dir("step_x") is None and parse_step_dir(".staging-step_4") is None
    assert checkpoints_key("exp", "t0") == "exp/t0/checkpoints"
    with pytest.raises(CheckpointError, match="path component"):
        checkpoints_key("a/b", "t0")
    with pytest.raises(CheckpointError, match=">= 0"):
        step_dir(-1)


def test_metadata_round_trip_and_validation():
    meta = CheckpointMetadata(
        step=4,
        epoch=1,
        version=4,
        metrics={"loss": 0.5},
        parent=3,
        incremental=True,
        references={"step_1": ["dcp/rank-00000.distcp"]},
        sizes=ByteCounts(100, 40, 60),
        files={"a.json": FileInfo(3, "ab")},
    )
    assert CheckpointMetadata.from_json(meta.to_json()) == meta
    assert meta.summary()["bytes_referenced"] == 60
    with pytest.raises(CheckpointError, match="format"):
        CheckpointMetadata.from_dict({"format": 99, "step": 1})
    with pytest.raises(CheckpointError, match="JSON"):
        CheckpointMetadata.from_json("{not json")


def test_config_payload_matches_the_run_config_hash():
    from areal_tasks.config.job import JobConfig
    from areal_tasks.config.serialize import config_hash

    job = JobConfig()
    data, digest = config_payload(job)
    assert digest == config_hash(job) and data["experiment"]["name"] == job.experiment.name
    assert config_payload(None) == (None, None)
    assert config_payload({"b": 1, "a": 2})[1] == config_payload({"a": 2, "b": 1})[1]
    with pytest.raises(CheckpointError, match="JSON-serialisable"):
        config_payload({"x": object()})


def test_trainer_state_must_be_json():
    assert TrainerState.from_dict(TrainerState(step=2, dataloader={"i": 3}).to_dict()).dataloader == {"i": 3}
    with pytest.raises(CheckpointError, match="JSON"):
        TrainerState(step=1, extra={"x": object()}).to_dict()
