"""Main program of one sandboxed code run (started by :mod:`areal_tasks.rollout.rewards.sandbox`).

Run by file path with ``python -I -S`` and the standard library only, as root inside fresh
network, pid, mount, IPC and UTS namespaces where the parent could create them. It reads its job
(``code``, ``tests``, limits, uid/gid, paths to hide, a nonce) as JSON from stdin, then, before any
untrusted code runs: changes into the scratch directory, mounts empty read-only tmpfs over the
paths to hide (the scratch directory stays reachable as the working directory), sets the resource
limits (hard = soft, so the code cannot raise them), drops to the unprivileged uid/gid and forgets
the job. It then runs the code and each top-level statement of the tests (a top-level ``assert`` is
one test) and writes one JSON line, carrying the nonce, to the result fd the parent passed.
"""

from __future__ import annotations

import ast
import ctypes
import errno
import json
import os
import resource
import signal
import sys
from typing import Any

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8


def _hide(paths: list[str], keep: list[str]) -> list[str]:
    """Mount an empty read-only tmpfs over each path; notes for the ones that could not be hidden."""
    notes: list[str] = []
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    for path in paths:
        if not os.path.isdir(path) or any(k == path or k.startswith(path.rstrip("/") + "/") for k in keep):
            continue
        if libc.mount(b"none", path.encode(), b"tmpfs", flags, b"size=4k,mode=0755") != 0:
            notes.append(f"cannot hide {path}: {os.strerror(ctypes.get_errno())}")
    return notes


def _limit(limits: dict[str, int]) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, key in (("RLIMIT_AS", "memory_bytes"), ("RLIMIT_FSIZE", "file_bytes"), ("RLIMIT_NPROC", "nproc")):
        value = int(limits[key])
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


class CpuLimit(BaseException):
    """Raised from SIGXCPU: the soft CPU limit was reached (the hard one kills a second later)."""


def _on_xcpu(signum: int, frame: Any) -> None:
    raise CpuLimit


def classify(exc: BaseException) -> str:
    """A short reason for an exception raised by the code or a test."""
    if isinstance(exc, CpuLimit):
        return "timeout (cpu)"
    if isinstance(exc, MemoryError):
        return "memory limit"
    if isinstance(exc, RecursionError):
        return "recursion limit"
    if isinstance(exc, OSError):
        code = exc.errno
        if code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.EAFNOSUPPORT):
            return "network blocked"
        if code == errno.EFBIG:
            return "file size limit"
        if code == errno.EAGAIN:
            return "process limit"
        if code in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EROFS):
            return "file access denied"
    if isinstance(exc, SystemExit):
        return "exit called"
    if isinstance(exc, AssertionError):
        return "assertion failed"
    return f"error: {type(exc).__name__}"


def _run(code: str, tests: str) -> dict[str, Any]:
    try:
        compiled = compile(code, "solution.py", "exec")
        tree = ast.parse(tests, "tests.py")
    except SyntaxError as exc:
        where = "solution" if exc.filename == "solution.py" else "tests"
        return {"status": "syntax_error", "detail": f"{where} line {exc.lineno}: {exc.msg}"}
    scope: dict[str, Any] = {"__name__": "__main__"}
    try:
        exec(compiled, scope)
    except BaseException as exc:  # noqa: BLE001 - untrusted code: every failure is a reason
        return {"status": "code_error", "reason": classify(exc), "detail": repr(exc)[:300]}
    passed = total = 0
    first: dict[str, str] | None = None
    asserts = [n for n in tree.body if isinstance(n, ast.Assert)]
    for node in tree.body:
        is_test = isinstance(node, ast.Assert) or not asserts
        total += is_test
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), "tests.py", "exec"), scope)
        except BaseException as exc:  # noqa: BLE001 - untrusted code: every failure is a reason
            first = first or {"reason": classify(exc), "detail": f"tests line {node.lineno}: {exc!r}"[:300]}
            if not is_test:
                return {"status": "tests_error", **first}
            continue
        passed += is_test
    if not asserts:  # the whole test code is one test
        passed, total = (0 if first else 1), 1
    return {"status": "done", "passed": passed, "total": total, **(first or {})}


def main() -> None:
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    nonce, notes, result_fd = job["nonce"], [], job["result_fd"]
    os.chdir(job["scratch"])
    if job["hide"]:
        notes += _hide(job["hide"], [sys.base_prefix, sys.prefix, os.path.dirname(sys.executable)])
    signal.signal(signal.SIGXCPU, _on_xcpu)
    _limit(job["limits"])
    if job["uid"] is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(job["gid"])
        os.setuid(job["uid"])
    code, tests = job["code"], job["tests"]
    del job
    sys.setrecursionlimit(2000)
    result = _run(code, tests)
    result["nonce"], result["notes"] = nonce, notes
    os.write(result_fd, (json.dumps(result) + "\n").encode())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
