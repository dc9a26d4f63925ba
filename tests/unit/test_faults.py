"""The fault points of ``areal_tasks.api.faults``: parsing, matching, ``once``, a real SIGKILL, pause.

The firing actions run in child interpreters (one SIGKILLs itself, one freezes until killed).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_tasks.api.faults import FAULTS_ENV, FaultSpec, fault_point, parse_faults

pytestmark = pytest.mark.timeout(60)

_CALL = "import logging; logging.basicConfig(); from areal_tasks.api.faults import fault_point; {}; print('passed')"


def _run(code: str, env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CALL.format(code)], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_parse_specs() -> None:
    specs = parse_faults("rl.step.before_update:rank=1:step=4:once=/x/f ; a.b:action=pause:reached=/r")
    assert specs == [
        FaultSpec("rl.step.before_update", {"rank": "1", "step": "4"}, "sigkill", "/x/f", None, None),
        FaultSpec("a.b", {}, "pause", None, "/r", None),
    ]
    with pytest.raises(ValueError, match="not key=value"):
        parse_faults("p:rank")
    with pytest.raises(ValueError, match="action 'explode'"):
        parse_faults("p:action=explode")


def test_unset_or_unmatched_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    fault_point("rl.step.before_update", step=4)
    monkeypatch.setenv(FAULTS_ENV, "rl.step.before_update:rank=1:step=4")
    monkeypatch.setenv("RANK", "0")
    fault_point("rl.step.before_update", step=4)  # another rank
    fault_point("rl.step.before_update", step=3, rank=1)  # another step
    fault_point("checkpoint.save.before_complete", step=4, rank=1)  # another point


def test_sigkill_fires_once_and_logs_first(tmp_path: Path) -> None:
    once = tmp_path / "fired"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
        "RANK": "1",
        FAULTS_ENV: f"rl.step.before_update:rank=1:step=4:once={once}",
    }
    first = _run("fault_point('rl.step.before_update', step=4)", env)
    assert first.returncode == -signal.SIGKILL
    assert "fault rl.step.before_update fired on rank 1 (step=4): sigkill" in first.stderr
    assert once.is_file()
    second = _run("fault_point('rl.step.before_update', step=4)", env)  # the retried attempt
    assert second.returncode == 0 and "passed" in second.stdout


def test_pause_marks_reached_holds_and_goes_on_when_released(tmp_path: Path) -> None:
    once = tmp_path / "paused"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), FAULTS_ENV: f"p:action=pause:once={once}"}
    proc = subprocess.Popen([sys.executable, "-c", _CALL.format("fault_point('p')")], env=env)
    try:
        reached = Path(f"{once}.reached")
        deadline = time.monotonic() + 20
        while not reached.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)
        assert proc.poll() is None  # holding
        Path(f"{once}.release").touch()
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_faults_module_is_torch_free() -> None:
    code = "import sys, areal_tasks.api.faults; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
