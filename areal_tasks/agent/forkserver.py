"""A fork server for agent programs: import the heavy modules once, fork a fresh process per episode.

Run by the ``agent_command`` workflow (``preload`` option) with the **agent's own interpreter**, as
a file (``python .../forkserver.py MODULE...``): it uses the standard library only, so it needs
nothing installed next to the agent. It imports the ``MODULE`` arguments, then serves requests,
one JSON object per line on stdin::

    {"id": 7, "argv": ["script.py", "--flag"] | ["-m", "pkg.mod", ...], "env": {...},
     "cwd": "/dir" | null, "stdin": "/tmp/x/in", "stdout": "/tmp/x/out", "stderr": "/tmp/x/err"}

For each it forks a child that starts a new session (its own process group, so the caller can kill
it and whatever it spawned), replaces its environment with ``env``, connects its standard streams
to the three files and runs the program as ``__main__`` (``runpy``), exactly as ``python argv...``
would, minus the start-up and import time. Each answer is one JSON line on stdout:
``{"id": 7, "pid": 1234}`` once forked, ``{"id": 7, "exit": 0}`` once reaped (a negative exit is
the signal that killed it; ``{"id": 7, "error": "..."}`` if it could not fork). End of stdin stops
the server; its running children are left to the caller, which owns their process groups.

The preloaded modules are imported with the server's environment (which the caller keeps free of
secrets and per-episode values): a module that reads the environment at import time sees that, not
the episode's.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import sys
import traceback
from typing import Any

#: seconds between checks for exited children while no request arrives.
POLL_S = 0.02


def _child(request: dict[str, Any]) -> int:
    """Runs in the forked child: become the program and run it; its exit status."""
    os.setsid()
    for fd, key, flags in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
        target = os.open(request[key], flags)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, closed at exit
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    argv = list(request["argv"])
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the program's failure: its traceback to its stderr, as python does
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            code = code or 1
    return code


def _answer(message: dict[str, Any]) -> None:
    sys.__stdout__.write(json.dumps(message) + "\n")
    sys.__stdout__.flush()


def _reap(children: dict[int, Any]) -> None:
    """Answer the exit of every child that ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        request_id = children.pop(pid, None)
        if request_id is not None:
            _answer({"id": request_id, "exit": os.waitstatus_to_exitcode(status)})


def serve(preload: list[str]) -> None:
    """Import ``preload``, then fork a child per request line until stdin ends."""
    for name in preload:
        importlib.import_module(name)
    _answer({"ready": True, "preloaded": preload})
    children: dict[int, Any] = {}
    stdin = sys.stdin.buffer
    pending = b""
    while True:
        readable, _, _ = select.select([stdin], [], [], POLL_S)
        _reap(children)
        if not readable:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as exc:
                _answer({"id": request["id"], "error": f"fork failed: {exc}"})
                continue
            if pid == 0:  # the child never returns into this loop, whatever happens
                code = 1
                try:
                    code = _child(request)
                except BaseException:  # noqa: BLE001 - setting up the run failed: say why, exit 1
                    traceback.print_exc()
                finally:
                    os._exit(code)
            children[pid] = request["id"]
            _answer({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    # run as a file, Python put this file's directory first on sys.path: its sibling modules
    # (requests.py, client.py...) must not shadow the agent's own imports
    del sys.path[0]
    serve(sys.argv[1:])
