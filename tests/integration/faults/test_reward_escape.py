"""A reward that escapes its worker's process group and hangs is still killed (issue #26, item 7).

Real reward worker processes; each escaping process writes its pid to a file so the test can watch
it. Before the tree kill, ``killpg`` of the worker's session left a ``setsid`` child alive for its
whole 300 s sleep.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areal_tasks.errors import RewardTimeoutError
from areal_tasks.launch.process import pid_alive
from areal_tasks.rollout.rewards import RewardRunner
from tests.fixtures import faults

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

GONE_WITHIN_S = 2.0


def _wait_for_pid(path: Path, deadline_s: float = 20.0) -> int:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written within {deadline_s:g} s"
        time.sleep(0.02)
    return int(path.read_text())


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids to SIGKILL after the test whatever happened (a failing test must not leak sleepers)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, 9)


@pytest.mark.parametrize(
    "reward",
    [faults.setsid_child_then_hang, faults.daemon_without_env_then_hang],
    ids=["setsid-child", "double-fork-empty-env"],
)
def test_timed_out_reward_takes_its_escaped_process_with_it(
    reward: Callable[..., float], tmp_path: Path, leftovers: list[int]
) -> None:
    pid_file = tmp_path / "escaped.pid"
    runner = RewardRunner(reward, max_workers=1, timeout_s=3.0)
    try:
        with pytest.raises(RewardTimeoutError):
            runner.score_sync("x", "y", pid_file=str(pid_file))
        timed_out_at = time.monotonic()
        escaped = _wait_for_pid(pid_file)
        leftovers.append(escaped)
        assert _gone_within(escaped, GONE_WITHIN_S), f"escaped process {escaped} alive after the reward timed out"
        print(f"escaped process gone {time.monotonic() - timed_out_at:.2f} s after the timeout")
    finally:
        runner.close()


def test_closing_the_runner_kills_what_a_finished_reward_left_behind(tmp_path: Path, leftovers: list[int]) -> None:
    pid_file = tmp_path / "daemon.pid"
    runner = RewardRunner(faults.setsid_daemon_and_return, max_workers=1, timeout_s=10.0)
    try:
        assert runner.score_sync("x", "y", pid_file=str(pid_file)) == 1.0
        daemon = _wait_for_pid(pid_file)
        leftovers.append(daemon)
        assert pid_alive(daemon)
    finally:
        runner.close()
    assert _gone_within(daemon, GONE_WITHIN_S), f"the reward's daemon {daemon} outlived the runner"
