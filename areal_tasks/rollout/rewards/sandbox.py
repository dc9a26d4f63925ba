"""The ``code_tests`` reward: run the completion's Python code plus the reference unit tests in a
sandboxed subprocess and score 1.0 when every test passes (or the fraction passed, on request).

Isolation, where the host allows it (root on Linux with the ``unshare`` binary): fresh network
(only a downed loopback: every connection fails), pid (killing the run kills everything it
started), mount, IPC and UTS namespaces; empty read-only tmpfs over the paths to hide (``/tmp``,
``/work``, ``/root``, ``/home``, the project, ...); an unprivileged uid (``nobody``); a fresh 0700
scratch directory as working directory, removed afterwards; a cleared environment; ``python -I
-S``; CPU, address-space, file-size, process-count and open-file limits, no core dumps; a wall
timeout after which the process group is killed; captured output capped. Without root or
``unshare`` the run still gets the limits and scratch directory, and the reason says the isolation
was weaker. See ``docs/rewards.md`` for what it cannot isolate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards.registry import register_reward

logger = logging.getLogger(__name__)

_BOOT = str(Path(__file__).with_name("_sandbox_boot.py"))
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_NOBODY = 65534
_PROJECT = str(Path(__file__).resolve().parents[3])
DEFAULT_HIDE = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/work", "/root", "/home", _PROJECT)
_NAMESPACES = ["--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc", "--uts"]


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (defaults suit unit-test-sized problems)."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 16 * 2**20
    nproc: int = 32
    output_bytes: int = 64 * 2**10


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run: the reward, a short reason, counts and the isolation actually used."""

    reward: float
    reason: str
    passed: int = 0
    total: int = 0
    isolation: tuple[str, ...] = ()
    output: str = ""
    weaker: tuple[str, ...] = field(default_factory=tuple)


def extract_code(completion: str) -> str:
    """The last ```python fenced block of ``completion`` (any fence if none is tagged), else its text."""
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1]
    return completion


def _world_reachable(path: str) -> bool:
    """True if every directory above ``path`` is searchable by others (so ``nobody`` can run it)."""
    parts = Path(path).resolve().parents
    return all(os.stat(p).st_mode & 0o001 for p in parts) and bool(os.stat(path).st_mode & 0o005)


def sandbox_python() -> str:
    """An interpreter the unprivileged uid can run: ours if reachable, else the system one."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if candidate and os.path.exists(candidate) and _world_reachable(candidate):
            return candidate
    return sys.executable


def _argv(python: str, weaker: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    base = [python, "-I", "-S", _BOOT]
    if os.geteuid() != 0:
        weaker.append("not root: no namespaces, no uid drop")
        return base
    if unshare is None:
        weaker.append("no unshare binary: no network/pid/mount namespaces")
        return base
    probe = subprocess.run([unshare, *_NAMESPACES, "true"], capture_output=True, timeout=10, check=False)
    if probe.returncode != 0:
        weaker.append(f"unshare failed ({probe.stderr.decode(errors='replace').strip()[:120]}): no namespaces")
        return base
    return [unshare, *_NAMESPACES, "--", *base]


def run_sandboxed(
    code: str,
    tests: str,
    limits: SandboxLimits | None = None,
    *,
    partial: bool = False,
    hide: tuple[str, ...] = DEFAULT_HIDE,
) -> SandboxResult:
    """Run ``code`` then ``tests`` in the sandbox; 1.0 if all tests pass (the fraction with ``partial``)."""
    limits = limits or SandboxLimits()
    weaker: list[str] = []
    argv = _argv(sandbox_python(), weaker)
    namespaced = Path(argv[0]).name == "unshare"
    as_root = os.geteuid() == 0
    scratch = tempfile.mkdtemp(prefix="areal-sandbox-")
    private = tempfile.mkdtemp(prefix="areal-sandbox-io-")
    try:
        if as_root:
            os.chown(scratch, _NOBODY, _NOBODY)
        nonce = secrets.token_hex(16)
        job = {
            "code": code,
            "tests": tests,
            "nonce": nonce,
            "scratch": scratch,
            "hide": list(hide) if namespaced else [],
            "uid": _NOBODY if as_root else None,
            "gid": _NOBODY if as_root else None,
            "limits": {
                "cpu_s": limits.cpu_s,
                "memory_bytes": limits.memory_bytes,
                "file_bytes": limits.file_bytes,
                "nproc": limits.nproc,
            },
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        out_path, res_path = os.path.join(private, "out"), os.path.join(private, "result")
        with open(out_path, "wb") as out, open(res_path, "wb") as res:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=scratch,
                start_new_session=True,
                close_fds=True,
                pass_fds=(res.fileno(),),
            )
            timed_out = False
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({**job, "result_fd": res.fileno()}).encode())
                proc.stdin.close()
                proc.wait(timeout=limits.wall_s)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                timed_out = True
            finally:
                _kill_group(proc)
        output = _read_capped(out_path, limits.output_bytes)
        reply = _read_capped(res_path, limits.output_bytes)
        isolation = ("namespaces", "nobody", "rlimits") if namespaced else ("rlimits",)
        return _score(reply, nonce, proc.returncode, timed_out, partial, output, isolation, weaker)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_capped(path: str, cap: int) -> str:
    with open(path, "rb") as fh:
        return fh.read(cap).decode(errors="replace")


def _score(
    reply: str,
    nonce: str,
    returncode: int | None,
    timed_out: bool,
    partial: bool,
    output: str,
    isolation: tuple[str, ...],
    weaker: list[str],
) -> SandboxResult:
    suffix = f" [weaker isolation: {'; '.join(weaker)}]" if weaker else ""
    common = {"isolation": isolation, "output": output, "weaker": tuple(weaker)}
    if timed_out:
        return SandboxResult(0.0, "timeout (wall)" + suffix, **common)
    try:
        result = json.loads(reply.strip().splitlines()[-1]) if reply.strip() else None
    except (json.JSONDecodeError, IndexError):
        result = None
    if not isinstance(result, dict) or result.get("nonce") != nonce:
        if returncode is not None and returncode in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU):
            return SandboxResult(0.0, "timeout (cpu)" + suffix, **common)
        return SandboxResult(0.0, f"crashed before reporting (exit code {returncode})" + suffix, **common)
    notes = result.get("notes") or []
    if notes:
        suffix += f" [{'; '.join(notes)}]"
    status = result.get("status")
    if status == "syntax_error":
        return SandboxResult(0.0, f"syntax error: {result.get('detail')}" + suffix, **common)
    if status in ("code_error", "tests_error"):
        where = "solution" if status == "code_error" else "test setup"
        return SandboxResult(0.0, f"{result.get('reason')} in {where}: {result.get('detail')}" + suffix, **common)
    passed, total = int(result.get("passed", 0)), int(result.get("total", 0))
    if total and passed == total:
        return SandboxResult(1.0, f"tests passed: {passed}/{total}" + suffix, passed, total, **common)
    reward = passed / total if partial and total else 0.0
    why = f" ({result.get('reason')}: {result.get('detail')})" if result.get("reason") else ""
    return SandboxResult(reward, f"tests failed: {passed}/{total} passed{why}" + suffix, passed, total, **common)


def score_code(completion: str, tests: str, *, partial: bool = False, **limits: Any) -> tuple[float, str]:
    """``(reward, reason)`` for the code in ``completion`` against ``tests``; ``limits`` as :class:`SandboxLimits`."""
    known = SandboxLimits.__dataclass_fields__
    unknown = sorted(set(limits) - set(known))
    if unknown:
        raise RewardError(f"code_tests reward: unknown limits {unknown}; known: {sorted(known)}")
    result = run_sandboxed(extract_code(completion), tests, SandboxLimits(**limits), partial=partial)
    return result.reward, result.reason


@register_reward("code_tests")
def code_tests(
    completion: str, answer: str, *, tests: str | None = None, partial: bool = False, **kwargs: Any
) -> float:
    """The sandboxed unit-test reward: the record's ``tests`` (a data set's ``dataset.columns.tests``)
    when given, else ``answer`` holds the tests; unknown keyword arguments (``metadata``...) are ignored."""
    limits = {k: v for k, v in kwargs.items() if k in SandboxLimits.__dataclass_fields__}
    reward, reason = score_code(completion, answer if tests is None else tests, partial=partial, **limits)
    logger.debug("code_tests reward %.3f: %s", reward, reason)
    return reward
