"""``RolloutProcess``: train rank 0's rollout side in a child process, driven over a pipe.

The side is built for real (tokenizer, reward pool, executor over the demo task) against an
address where nothing listens: the commands tested here do not reach a server. Checked: results
come back; an exception in the child is raised here with its own type and the child's traceback as
a note; a child that dies is reported by the next command with its exit code; a failed build is
raised by ``start``; close stops the child and is idempotent; ``rollout.own_process=auto`` means a
child process only when CUDA is there.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.process import RolloutProcess
from areal_tasks.rollout.side import RolloutSide, own_process

pytestmark = [pytest.mark.integration]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path, model: Path, *overrides: str):
    return load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={tmp_path}",
            f"model.path={model}",
            "dataset.path=demo:arithmetic?n_train=16&n_eval=4",
            "train.batch_size=8",
            "rollout.group_size=4",
            "rollout.max_concurrent_rollouts=8",
            "rollout.reward.workers=1",
            "train.sft_warmup_steps=0",
            "rollout.own_process=on",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory, tiny_qwen2: Path):
    cfg = _config(tmp_path_factory.mktemp("rollout_process"), tiny_qwen2)
    process = RolloutSide.open(cfg, [f"127.0.0.1:{_closed_port()}"], str(tiny_qwen2), version=2)
    assert isinstance(process, RolloutProcess)
    yield process
    process.close()


def test_commands_run_in_the_child_and_return_their_results(side: RolloutProcess) -> None:
    assert side.pid is not None and side.pid != os.getpid()
    assert side.n_servers == 1
    state = side.executor.state_dict()
    assert state["version"] == 2
    side.executor.set_version(3)
    assert side.executor.state_dict()["version"] == 3
    assert side.executor.stats()["accepted"] == 0
    assert side.executor.last_batch_stats() == {}


def test_an_error_in_the_child_is_raised_here_with_its_type_and_traceback(side: RolloutProcess) -> None:
    with pytest.raises(ConfigError, match="version=-1") as info:
        side.executor.set_version(-1)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "in the rollout process" in notes and "set_version" in notes
    with pytest.raises(RolloutError, match="not a rollout-process command"):
        side.call("client.aclose")
    assert side.executor.state_dict()["version"] == 3  # the child goes on serving after an error


def test_a_dead_child_is_reported_with_its_exit_code(tmp_path: Path, tiny_qwen2: Path) -> None:
    cfg = _config(tmp_path, tiny_qwen2)
    process = RolloutProcess.start(cfg, [f"127.0.0.1:{_closed_port()}"], str(tiny_qwen2), version=0)
    try:
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(RolloutError, match=r"died \(exit code -9\)"):
            process.executor.stats()
    finally:
        process.close()
        process.close()  # idempotent
    with pytest.raises(RolloutError, match="was closed"):
        process.executor.stats()


def test_a_side_that_cannot_be_built_fails_start(tmp_path: Path, tiny_qwen2: Path) -> None:
    cfg = _config(tmp_path, tiny_qwen2, "rollout.reward.fn=no_such_reward")
    with pytest.raises(Exception, match="no_such_reward") as info:
        RolloutProcess.start(cfg, ["127.0.0.1:1"], str(tiny_qwen2), version=0)
    assert "in the rollout process" in "\n".join(getattr(info.value, "__notes__", []))


def test_close_stops_the_child(tmp_path: Path, tiny_qwen2: Path) -> None:
    process = RolloutProcess.start(_config(tmp_path, tiny_qwen2), [f"127.0.0.1:{_closed_port()}"], str(tiny_qwen2), 0)
    pid = process.pid
    process.close()
    assert not process._process.is_alive() and process._process.exitcode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_own_process_auto_means_on_gpus_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert own_process("on") is True and own_process("off") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert own_process("auto") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert own_process("auto") is True
    with pytest.raises(ConfigError, match="auto, on or off"):
        own_process("yes")
