"""The ``trace`` section: validation, and how it reaches the train workers and the servers (environment, never argv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.errors import ConfigError
from areal_tasks.inference.launch.commands import build_server_command
from areal_tasks.trace.env import TRACE_DIR_ENV, TRACE_EVERY_ENV, TRACE_MAX_EVENTS_ENV, trace_environment
from areal_tasks.trainer.rl import rl_worker_spec


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("trace.every_n_steps=0", "trace.every_n_steps: must be >= 1"),
        ("trace.every_n_steps=1.5", "trace.every_n_steps: expected int"),
        ("trace.max_events=0", "trace.max_events: must be >= 1"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, override: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
        load_config("configs/base.yaml", [f"experiment.run_dir={tmp_path}", override])


def test_off_by_default_and_on_in_the_demo(tmp_path: Path) -> None:
    base = load_config("configs/base.yaml", [f"experiment.run_dir={tmp_path}"])
    assert not base.trace.enabled and trace_environment(base) == {}
    demo = load_config("configs/demo_grpo.yaml", [f"experiment.run_dir={tmp_path}", "trace.every_n_steps=3"])
    assert demo.trace.enabled
    assert trace_environment(demo) == {
        TRACE_DIR_ENV: str(tmp_path / "trace"),
        TRACE_EVERY_ENV: "3",
        TRACE_MAX_EVENTS_ENV: "1000000",
    }


def test_workers_and_servers_get_it_through_their_environment(tmp_path: Path) -> None:
    cfg = load_config("configs/demo_grpo.yaml", [f"experiment.run_dir={tmp_path}"])
    spec = rl_worker_spec(cfg, tmp_path / "rl_config.yaml", ["127.0.0.1:1"])
    assert spec.env[TRACE_DIR_ENV] == str(tmp_path / "trace")
    command = build_server_command(cfg, str(tmp_path / "model"))
    assert command.env[TRACE_DIR_ENV] == str(tmp_path / "trace")
    assert str(tmp_path / "trace") not in command.argv
    off = load_config("configs/demo_grpo.yaml", [f"experiment.run_dir={tmp_path}", "trace.enabled=false"])
    assert TRACE_DIR_ENV not in build_server_command(off, str(tmp_path / "model")).env
    assert TRACE_DIR_ENV not in rl_worker_spec(off, tmp_path / "c.yaml", ["127.0.0.1:1"]).env
