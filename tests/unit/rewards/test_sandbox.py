"""The sandboxed ``code_tests`` reward: correct and wrong solutions, and escape attempts (network,
files outside the scratch directory, fork bomb, runaway memory, infinite loop, huge file) that each
score 0 with a reason. Nothing leaves the machine: the only connection tried is to 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards import resolve_reward
from areal_tasks.rollout.rewards.sandbox import extract_code, run_sandboxed, score_code

TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\n"
ISOLATED = os.geteuid() == 0 and shutil.which("unshare") is not None
needs_isolation = pytest.mark.skipif(not ISOLATED, reason="namespaces and uid drop need root and unshare")


def test_extract_code_takes_the_last_python_fence_else_the_text() -> None:
    assert extract_code("x\n```python\na = 1\n```\nthen\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("d = 4") == "d = 4"


def test_correct_solution_scores_one_via_the_registry() -> None:
    reward = resolve_reward("code_tests")
    assert reward("Here:\n```python\ndef add(a, b):\n    return a + b\n```", TESTS) == 1.0
    assert score_code("def add(a, b):\n    return a + b\n", TESTS) == (1.0, "tests passed: 3/3")


def test_wrong_solution_scores_zero_with_reason_and_partial_fraction() -> None:
    reward, reason = score_code("def add(a, b):\n    return a * b if a < 0 else a + b - (a == 2)\n", TESTS)
    assert reward == 0.0 and reason.startswith("tests failed: 1/3 passed (assertion failed")
    reward, _ = score_code("def add(a, b):\n    return a + b if a != 2 else 0\n", TESTS, partial=True)
    assert reward == pytest.approx(2 / 3)


def test_syntax_error_and_unknown_limit() -> None:
    reward, reason = score_code("def add(a, b) return a", TESTS)
    assert reward == 0.0 and reason.startswith("syntax error: solution line 1")
    with pytest.raises(RewardError, match="unknown limits"):
        score_code("pass", TESTS, wall=3)


@needs_isolation
def test_network_is_blocked() -> None:
    code = (
        "import socket\n"
        "def add(a, b):\n"
        "    socket.create_connection(('127.0.0.1', 22), timeout=1).close()\n"
        "    return a + b\n"
    )
    reward, reason = score_code(code, TESTS)
    assert reward == 0.0 and "network blocked" in reason, reason


@pytest.fixture
def secret_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbox-secret-"))  # 0700, owned by the test's user
    (path / "secret.txt").write_text("s3cret")
    yield path
    shutil.rmtree(path)


@needs_isolation
def test_files_outside_the_scratch_dir_cannot_be_read(secret_dir: Path) -> None:
    for target in (secret_dir / "secret.txt", Path(__file__), Path(__file__).parents[3] / "pyproject.toml"):
        code = f"def add(a, b):\n    return a + b + len(open({str(target)!r}).read()) * 0\n"
        reward, reason = score_code(code, TESTS)
        assert reward == 0.0 and "file access denied" in reason, (target, reason)


@needs_isolation
def test_fork_bomb_hits_the_process_limit() -> None:
    reward, reason = score_code("import os\nwhile True:\n    os.fork()\n", TESTS, wall_s=3)
    assert reward == 0.0 and ("process limit" in reason or "timeout" in reason), reason


def test_runaway_memory_hits_the_memory_limit() -> None:
    reward, reason = score_code("x = bytearray(2 * 1024**3)\n", TESTS)
    assert reward == 0.0 and "memory limit" in reason, reason


def test_infinite_loop_times_out() -> None:
    assert score_code("while True:\n    pass\n", TESTS, cpu_s=1) == (0.0, "timeout (cpu) in solution: CpuLimit()")
    reward, reason = score_code("import time\ntime.sleep(60)\n", TESTS, wall_s=1)
    assert reward == 0.0 and reason.startswith("timeout (wall)"), reason


def test_huge_file_hits_the_file_size_limit() -> None:
    code = "with open('big', 'wb') as fh:\n    fh.write(b'x' * (64 * 2**20))\n"
    reward, reason = score_code(code, TESTS, file_bytes=2**20)
    assert reward == 0.0 and "file size limit" in reason, reason


def test_output_is_capped_and_scratch_removed() -> None:
    result = run_sandboxed("import os\nprint(os.getcwd(), flush=True)\nprint('x' * 10**6)\n", "assert True")
    assert result.reward == 1.0 and len(result.output) <= 64 * 2**10
    scratch = Path(result.output.splitlines()[0])
    assert scratch.name.startswith("areal-sandbox-") and not scratch.exists()


def test_code_tests_uses_the_records_tests_over_the_answer_in_a_worker_process() -> None:
    from areal_tasks.rollout.rewards import RewardRunner

    solution = "```python\ndef add(a, b):\n    return a + b\n```"
    with RewardRunner("code_tests", max_workers=1, timeout_s=30) as runner:
        # the tests= and metadata= keyword arguments travel to the worker process
        assert runner.score_sync(solution, "assert False", tests=TESTS, metadata={"id": 3}) == 1.0
        assert runner.score_sync(solution, "assert False") == 0.0
