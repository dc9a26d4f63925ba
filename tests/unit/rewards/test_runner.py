"""RewardRunner: worker processes, timeouts that kill, failures, bad results, concurrency, counters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import reward_helpers

from areal_tasks.errors import RewardError, RewardTimeoutError
from areal_tasks.rollout.rewards import RewardRunner


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer exists or is a zombie nobody of ours has to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _children() -> set[int]:
    """Direct children of this test process that still exist (zombies included)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            children.add(int(stat.parent.name))
    return children


@pytest.fixture
def runner() -> Iterator[RewardRunner]:
    with RewardRunner("reward_helpers:pid", max_workers=2, timeout_s=1.0) as r:
        yield r


def test_workers_run_the_reward_and_are_reused(runner: RewardRunner) -> None:
    first = runner.score_sync("c", "a")
    assert first != os.getpid()
    assert runner.score_sync("c", "a") == first  # same idle worker
    assert runner.worker_pids() == [int(first)]


def test_worker_imports_only_the_reward_module() -> None:
    # the caller has pytest (its __main__) and numpy loaded; a worker must not re-import them
    assert "pytest" in sys.modules
    with RewardRunner("reward_helpers:heavy_modules", max_workers=1, timeout_s=5) as r:
        assert r.score_sync("", "") == 0.0


def test_timeout_kills_the_worker_and_the_runner_recovers() -> None:
    with RewardRunner(reward_helpers.slow_pid, max_workers=1, timeout_s=0.5, name="slow") as r:
        old = int(r.score_sync("c", "a", delay=0.0))
        before = _children()
        start = time.monotonic()
        expected = r"'slow' did not finish within timeout_s=0.5 s.*killed.*timeout_s="
        with pytest.raises(RewardTimeoutError, match=expected):
            r.score_sync("c", "a", delay=30)
        assert time.monotonic() - start < 3
        assert r.worker_pids() == [] and _gone(old)
        assert _children() == before - {old}  # the killed worker was reaped: no zombie left
        new = int(r.score_sync("c", "a", delay=0.0))  # a fresh worker
        assert new != old and r.worker_pids() == [new]
        stats = r.stats()
        assert (stats["calls"], stats["failures"], stats["timeouts"], stats["workers_started"]) == (3, 1, 1, 2)


def test_timeout_also_kills_what_the_reward_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    with (
        RewardRunner("reward_helpers:hang_with_child", max_workers=1, timeout_s=0.4) as r,
        pytest.raises(RewardTimeoutError),
    ):
        r.score_sync("c", "a", pid_file=str(pid_file))
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 3
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)


def test_a_raising_reward_gives_reward_error_and_keeps_its_worker() -> None:
    with RewardRunner("reward_helpers:crash", max_workers=1, timeout_s=5) as r:
        with pytest.raises(RewardError, match=r"'reward_helpers:crash' raised ValueError: boom on 'x'") as info:
            r.score_sync("x", "a")
        assert "Traceback" in str(info.value) and not isinstance(info.value, RewardTimeoutError)
        pids = r.worker_pids()
        with pytest.raises(RewardError):
            r.score_sync("y", "a")
        assert r.worker_pids() == pids


def test_a_dying_worker_gives_reward_error_and_is_replaced() -> None:
    with RewardRunner("reward_helpers:die", max_workers=1, timeout_s=5) as r:
        with pytest.raises(RewardError, match="worker process died"):
            r.score_sync("x", "a")
        assert r.worker_pids() == []
        with pytest.raises(RewardError, match="worker process died"):
            r.score_sync("x", "a")
        assert r.stats()["workers_started"] == 2


@pytest.mark.parametrize("max_workers", [1, 0])
def test_non_finite_and_non_number_results(max_workers: int) -> None:
    with RewardRunner("reward_helpers:not_finite", max_workers=max_workers, timeout_s=5) as r:
        assert r.score_sync("0.25", "") == 0.25
        for bad in ("nan", "inf", "-inf"):
            with pytest.raises(RewardError, match="not a finite number"):
                r.score_sync(bad, "")
    with (
        RewardRunner("reward_helpers:not_a_number", max_workers=max_workers, timeout_s=5) as r,
        pytest.raises(RewardError, match=r"returned a str \('1.0'\), not a number"),
    ):
        r.score_sync("", "")


def test_concurrent_scores_share_the_pool() -> None:
    async def scenario(r: RewardRunner) -> list[float]:
        return await asyncio.gather(*(r.score("c", "a", delay=0.1) for _ in range(6)))

    with RewardRunner("reward_helpers:slow_pid", max_workers=2, timeout_s=5) as r:
        r.score_sync("c", "a", delay=0.0)  # start one worker outside the timing
        pids = asyncio.run(scenario(r))
        assert len(set(pids)) == 2
        assert r.stats()["calls"] == 7


def test_a_timeout_does_not_disturb_concurrent_calls() -> None:
    async def scenario(r: RewardRunner) -> list[object]:
        calls = [r.score("c", "a", delay=30)] + [r.score("c", "a", delay=0.05) for _ in range(3)]
        return await asyncio.gather(*calls, return_exceptions=True)

    with RewardRunner("reward_helpers:slow_pid", max_workers=2, timeout_s=0.5) as r:
        results = asyncio.run(scenario(r))
        assert isinstance(results[0], RewardTimeoutError)
        assert all(isinstance(x, float) for x in results[1:])
        stats = r.stats()
        assert (stats["calls"], stats["failures"], stats["timeouts"]) == (4, 1, 1)
        assert stats["total_s"] > 0.5


def test_reward_output_on_stdout_does_not_break_the_protocol(capfd: pytest.CaptureFixture[str]) -> None:
    with RewardRunner("reward_helpers:noisy", max_workers=1, timeout_s=5) as r:
        assert r.score_sync("", "") == 0.5
        assert r.score_sync("", "") == 0.5
    assert "chatter" in capfd.readouterr().err


def test_close_stops_the_workers_and_refuses_more_calls() -> None:
    r = RewardRunner("reward_helpers:pid", max_workers=2, timeout_s=5)
    r.score_sync("", "")
    (pid,) = r.worker_pids()
    r.close()
    assert _gone(pid) and r.worker_pids() == []
    with pytest.raises(RewardError, match="is closed"):
        r.score_sync("", "")
    r.close()  # idempotent


def test_close_while_a_call_runs_fails_that_call() -> None:
    r = RewardRunner("reward_helpers:hang", max_workers=1, timeout_s=30)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            r.score_sync("", "")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 5
    while not r.worker_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    (pid,) = r.worker_pids()
    r.close()
    thread.join(5)
    assert not thread.is_alive() and isinstance(errors[0], RewardError) and "closed" in str(errors[0])
    assert _gone(pid)


def test_workers_exit_when_the_caller_dies(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, sys, threading, time
        sys.path.insert(0, sys.argv[1])
        from areal_tasks.rollout.rewards import RewardRunner
        r = RewardRunner("reward_helpers:hang", max_workers=1, timeout_s=60)
        threading.Thread(target=r.score_sync, args=("", ""), daemon=True).start()
        while not r.worker_pids():
            time.sleep(0.02)
        print(r.worker_pids()[0], flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(Path(reward_helpers.__file__).parent)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.returncode == 0, out.stderr
    worker = int(out.stdout)
    deadline = time.monotonic() + 5
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker)


def test_functions_workers_cannot_import_are_refused() -> None:
    with pytest.raises(RewardError, match="cannot be imported by a worker.*max_workers=0"):
        RewardRunner(lambda c, a: 1.0, max_workers=1)
    module = types.ModuleType("only_in_this_process")
    exec("def score(completion, answer, **kw):\n    return 1.0\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        with (
            RewardRunner("only_in_this_process:score", max_workers=1, timeout_s=5) as r,
            pytest.raises(RewardError, match="cannot load only_in_this_process:score.*ModuleNotFoundError"),
        ):
            r.score_sync("", "")
    finally:
        del sys.modules[module.__name__]


def test_unpicklable_arguments() -> None:
    with (
        RewardRunner("reward_helpers:pid", max_workers=1, timeout_s=5) as r,
        pytest.raises(RewardError, match="cannot be pickled"),
    ):
        r.score_sync("", "", lock=threading.Lock())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_workers": -1}, "max_workers"), ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": float("inf")}, "timeout_s")],
)
def test_bad_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(RewardError, match=match):
        RewardRunner("numeric", **kwargs)


def test_in_process_mode() -> None:
    reward_helpers.RELEASE.clear()
    with RewardRunner(lambda c, a, **kw: float(len(c)), max_workers=0, timeout_s=1) as r:
        assert r.score_sync("abc", "") == 3.0
        assert asyncio.run(r.score("ab", "")) == 2.0
        assert r.worker_pids() == []
    with RewardRunner("reward_helpers:block", max_workers=0, timeout_s=0.3) as r:
        with pytest.raises(RewardTimeoutError, match="keeps running in its in-process thread"):
            r.score_sync("", "")
        with pytest.raises(RewardTimeoutError):
            asyncio.run(r.score("", ""))
        assert r.stats()["timeouts"] == 2
    reward_helpers.RELEASE.set()
    with RewardRunner("reward_helpers:raise_timeout", max_workers=0) as r:
        for call in (lambda: r.score_sync("", ""), lambda: asyncio.run(r.score("", ""))):
            with pytest.raises(RewardError, match="raised TimeoutError: upstream") as info:
                call()
            assert not isinstance(info.value, RewardTimeoutError)
    with RewardRunner("reward_helpers:crash", max_workers=0) as r:
        with pytest.raises(RewardError, match="raised ValueError: boom"):
            asyncio.run(r.score("x", ""))
        with pytest.raises(RewardError, match="raised ValueError: boom"):
            r.score_sync("x", "")


def test_builtin_by_name_in_workers() -> None:
    async def scenario(r: RewardRunner) -> list[float]:
        return await asyncio.gather(r.score("Answer: 4", "4"), r.score("Answer: 5", "4"), r.score("4.0", "4"))

    with RewardRunner("numeric", timeout_s=10) as r:
        assert asyncio.run(scenario(r)) == [1.0, 0.0, 1.0]
        assert r.name == "numeric" and r.stats()["failures"] == 0
