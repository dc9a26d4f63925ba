"""Retention: which checkpoints are kept, and prune plans that never delete referenced data."""

from __future__ import annotations

import pytest

from areal_tasks.checkpoint.retention import PrunePlan, RetentionPolicy, plan_prune, select_kept
from areal_tasks.config.sections import SaverConfig
from areal_tasks.errors import CheckpointError


def test_keep_last_every_and_best():
    metrics = {s: {"reward": r} for s, r in {10: 0.5, 20: 0.9, 30: 0.1, 40: 0.2, 50: 0.3}.items()}
    kept = select_kept(metrics, RetentionPolicy(keep_last=2, keep_every=30, keep_best_metric="reward"))
    assert kept == {20: ["best reward"], 30: ["every 30"], 40: ["last"], 50: ["last"]}


def test_best_metric_ties_go_to_the_newer_and_non_finite_values_are_ignored():
    metrics = {1: {"r": 1.0}, 2: {"r": float("nan")}, 3: {"r": 1.0}, 4: {}, 5: {"r": float("inf")}, 6: {"r": 0.0}}
    assert select_kept(metrics, RetentionPolicy(keep_last=1, keep_best_metric="r")) == {3: ["best r"], 6: ["last"]}


def test_policy_validation_and_saver_config():
    with pytest.raises(CheckpointError, match="keep_last"):
        RetentionPolicy(keep_last=0)
    with pytest.raises(CheckpointError, match="keep_every"):
        RetentionPolicy(keep_every=0)
    policy = RetentionPolicy.from_saver(SaverConfig(keep_last=3, keep_every=5, keep_best_metric="acc"))
    assert policy == RetentionPolicy(3, 5, "acc")


def test_prune_deletes_partial_and_old_and_strips_referenced():
    directories = {
        "step_1": ["_COMPLETE", "metadata.json", "dcp/index.json", "dcp/rank-00000.distcp", "dcp/rank-00001.distcp"],
        "step_2": ["_COMPLETE", "metadata.json", "dcp/index.json", "dcp/rank-00000.distcp"],
        "step_3": ["_COMPLETE", "metadata.json", "dcp/index.json", "dcp/rank-00000.distcp"],
        "step_4": ["dcp/rank-00000.distcp", "dcp/.tmp-rank-00001.distcp.abc"],  # a killed save
    }
    complete = {
        1: ({}, {}),
        2: ({}, {"step_1": ["dcp/rank-00000.distcp"]}),
        3: ({}, {"step_1": ["dcp/rank-00000.distcp"]}),
    }
    plan = plan_prune(directories, complete, RetentionPolicy(keep_last=1))
    assert plan.kept == {3: ["last"]}
    assert plan.delete == ["step_2", "step_4"]
    assert plan.strip == {"step_1": ["_COMPLETE", "dcp/index.json", "dcp/rank-00001.distcp", "metadata.json"]}
    assert plan.strip["step_1"][0] == "_COMPLETE"  # readers stop trusting it before anything else goes


def test_prune_protects_and_refuses_dangling_references():
    directories = {"step_1": ["dcp/rank-00000.distcp"], "step_2": ["_COMPLETE"], "step_3": ["x"]}
    plan = plan_prune(directories, {2: ({}, {})}, RetentionPolicy(keep_last=1), protect=["step_3"])
    assert plan == PrunePlan(kept={2: ["last"]}, delete=["step_1"], strip={})
    with pytest.raises(CheckpointError, match="missing"):
        plan_prune(
            {"step_1": [], "step_2": ["_COMPLETE"]},
            {2: ({}, {"step_1": ["dcp/rank-00000.distcp"]})},
            RetentionPolicy(keep_last=1),
        )
