"""A short traced RL run: ``trace.enabled`` gives one valid ``trace.json`` with the spans of the
controller, the train rank, the rollout process and the server, nested, on one clock.

Two RL steps of the demo config's tiny model (no warm start: learning is not the point), one train
rank, the rollout side in its own process, rewards in a worker process, a checkpoint at the end. The
clocks of the processes agree when each client request's span encloses the server's handling of
the same request (same ``rid``), and the rollout process's weight-swap request encloses the
server's swap of that version, inside the train rank's weight update.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trace import check_trace
from areal_tasks.trainer.rl import run_train

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

#: microseconds two processes' clocks on one host may disagree by (both anchor time.time_ns()).
CLOCK_SLACK_US = 1000.0


def _encloses(outer: dict, inner: dict, slack: float = CLOCK_SLACK_US) -> bool:
    return outer["ts"] - slack <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack


def test_a_traced_run_writes_one_valid_trace_of_every_process(tmp_path: Path) -> None:
    cfg = load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={tmp_path}",
            "allocation=embedded:d1+fsdp:d1",
            "dataset.path=demo:arithmetic?n_train=64&n_eval=4",
            "train.sft_warmup_steps=0",
            "train.total_steps=2",
            "train.batch_size=8",
            "rollout.group_size=4",
            "rollout.max_concurrent_rollouts=8",
            "rollout.sampling.max_new_tokens=4",
            "rollout.reward.workers=1",
            "rollout.own_process=on",
            "actor.micro_batch.granularity=4",
            "actor.micro_batch.n_mbs=2",
            "evaluation.n_samples=1",
            "saver.freq_steps=2",
            "trace.enabled=true",
        ],
    )
    run_train(cfg)
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert check_trace(doc) == []
    assert doc["otherData"]["skipped_lines"] == 0
    events = doc["traceEvents"]
    roles = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(roles.values()) == ["controller", "rollout", "server 0", "train rank 0"]
    by_role: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_role[roles[e["pid"]]].append(e)

    def named(role: str, name: str) -> list[dict]:
        return [e for e in by_role[role] if e["name"] == name]

    for name in ("job", "start servers", "rl workers", "stop servers"):
        assert named("controller", name), name
    for name in (
        "rl step",
        "batch wait",
        "train step",
        "micro-batch forward",
        "micro-batch backward",
        "optimizer step",
        "actor update",
        "weight update",
        "weight gather/pack",
        "servers swap",
        "evaluation",
        "checkpoint save",
    ):
        assert named("train rank 0", name), name
    for name in ("generate", "generate request", "reward", "swap request"):
        assert named("rollout", name), name
    for name in ("/generate", "swap weights", "pause", "load weights", "resume"):
        assert named("server 0", name), name
    # the train rank's spans nest: each step's work inside its "rl step"
    steps = {e["args"]["step"]: e for e in named("train rank 0", "rl step")}
    assert sorted(steps) == [1, 2]
    for name in ("batch wait", "optimizer step", "weight update", "checkpoint save"):
        for e in named("train rank 0", name):
            if e["args"].get("step") is not None:
                assert _encloses(steps[e["args"]["step"]], e, slack=0.0), (name, e)
    # one clock: every client request encloses the server's handling of it
    served = {e["args"]["rid"]: e for e in named("server 0", "/generate")}
    requests = named("rollout", "generate request")
    matched = [(r, served[r["args"]["rid"]]) for r in requests if r["args"]["rid"] in served]
    assert len(matched) >= len(requests) // 2 > 0
    assert all(_encloses(client, server) for client, server in matched)
    # and a weight update: trainer's update > rollout's swap request > the server's swap of that version
    for swap in named("server 0", "swap weights"):
        version = int(swap["args"]["version"])
        (client,) = [e for e in named("rollout", "swap request") if e["args"]["version"] == version]
        (update,) = [e for e in named("train rank 0", "weight update") if e["args"]["version"] == version]
        assert _encloses(client, swap) and _encloses(update, client)
    # the controller's "rl workers" span holds every train-rank span
    (workers,) = named("controller", "rl workers")
    assert all(_encloses(workers, e) for e in by_role["train rank 0"])
