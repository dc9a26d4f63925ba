"""Running an agent program per episode: a fresh ``exec`` each time, or a fork of a preloaded server.

:class:`ProgramRunner` runs ``argv`` with a payload on stdin and returns ``(exit status, stdout,
stderr)``. Without ``preload`` every run is a new process (``asyncio.create_subprocess_exec``).
With ``preload`` (module names) and an ``argv`` of the form ``python script.py ...`` or ``python -m
module ...``, one fork server (``forkserver.py``, run by that same interpreter) imports the modules
once and each run is a fork of it: the program starts in milliseconds instead of paying its
interpreter start-up and imports (0.4 s for ``openai``, 1.3 s for ``openai-agents`` on this
machine's CPUs) per episode. Either way the program is its own session (process group): running
past ``timeout_s`` or being cancelled kills the group, and :class:`~areal_tasks.errors.AgentError`
says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_tasks.errors import AgentError

logger = logging.getLogger(__name__)

__all__ = ["ProgramRunner"]

FORKSERVER = Path(__file__).with_name("forkserver.py")
#: seconds the fork server may take to import ``preload``.
READY_TIMEOUT_S = 120.0


class ProgramRunner:
    """Runs one agent program per call (see the module doc); :meth:`aclose` stops the fork server."""

    def __init__(self, argv: Sequence[str], *, preload: Sequence[str] = (), base_env: dict[str, str]) -> None:
        self.argv = list(argv)
        self.preload = list(preload)
        self.base_env = dict(base_env)
        if self.preload and (len(self.argv) < 2 or (self.argv[1].startswith("-") and self.argv[1] != "-m")):
            raise AgentError(
                f"preload needs a command 'python script.py ...' or 'python -m module ...', not {self.argv!r}"
            )
        if self.preload and self.argv[1] == "-m" and len(self.argv) < 3:
            raise AgentError(f"preload: the command {self.argv!r} names no module after -m")
        self._server: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._waiters: dict[int, dict[str, asyncio.Future[Any]]] = {}
        self._ids = itertools.count()

    async def run(
        self, env: dict[str, str], payload: bytes, timeout_s: float, cwd: str | None
    ) -> tuple[int, bytes, bytes]:
        """``(exit status, stdout, stderr)`` of one run; AgentError past ``timeout_s``."""
        if self.preload:
            return await self._run_forked(env, payload, timeout_s, cwd)
        process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(payload), timeout=timeout_s)
        except TimeoutError as exc:
            await _kill_group(process.pid, process.wait())
            raise AgentError(f"agent command {self.argv[0]} ran past timeout_s={timeout_s:g}") from exc
        except BaseException:
            await _kill_group(process.pid, process.wait())
            raise
        return int(process.returncode or 0), out, err

    # -- the fork server -------------------------------------------------------------------------

    async def _ensure_server(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is not None and self._server.returncode is None:
                return
            self._server = await asyncio.create_subprocess_exec(
                self.argv[0],
                str(FORKSERVER),
                *self.preload,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,  # its own import errors reach the job's log
                env=self.base_env,
            )
            assert self._server.stdout is not None
            try:
                line = await asyncio.wait_for(self._server.stdout.readline(), READY_TIMEOUT_S)
            except TimeoutError:
                line = b""
            if not line.startswith(b'{"ready"'):
                await self._stop_server()
                raise AgentError(
                    f"the agent fork server ({self.argv[0]}) could not import preload={self.preload}; "
                    "see the job's log for its error"
                )
            self._reader = asyncio.ensure_future(self._read_answers(self._server.stdout))
            logger.info("agent fork server started with %s preloaded", ", ".join(self.preload))

    async def _read_answers(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            answer = json.loads(line)
            waiter = self._waiters.get(answer.get("id", -1))
            if waiter is None:
                continue
            if "error" in answer and not waiter["pid"].done():
                waiter["pid"].set_exception(AgentError(f"agent fork server: {answer['error']}"))
            for key in ("pid", "exit"):
                if key in answer and not waiter[key].done():
                    waiter[key].set_result(answer[key])
        gone = AgentError("the agent fork server exited")
        for waiter in self._waiters.values():
            for future in waiter.values():
                if not future.done():
                    future.set_exception(gone)
                    future.exception()

    async def _run_forked(
        self, env: dict[str, str], payload: bytes, timeout_s: float, cwd: str | None
    ) -> tuple[int, bytes, bytes]:
        await self._ensure_server()
        assert self._server is not None and self._server.stdin is not None
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        waiter = {"pid": loop.create_future(), "exit": loop.create_future()}
        self._waiters[request_id] = waiter
        workdir = Path(tempfile.mkdtemp(prefix="areal-agent-"))
        try:
            files = {name: workdir / name for name in ("stdin", "stdout", "stderr")}
            files["stdin"].write_bytes(payload)
            files["stdout"].touch()
            files["stderr"].touch()
            request = {
                "id": request_id,
                "argv": self.argv[1:],
                "env": env,
                "cwd": cwd,
                **{name: str(path) for name, path in files.items()},
            }
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            await self._server.stdin.drain()
            pid = await waiter["pid"]
            try:
                code = await asyncio.wait_for(asyncio.shield(waiter["exit"]), timeout=timeout_s)
            except TimeoutError as exc:
                await _kill_group(pid, waiter["exit"])
                raise AgentError(f"agent command {self.argv[1]} ran past timeout_s={timeout_s:g}") from exc
            except BaseException:
                await _kill_group(pid, waiter["exit"])
                raise
            return int(code), files["stdout"].read_bytes(), files["stderr"].read_bytes()
        finally:
            self._waiters.pop(request_id, None)
            shutil.rmtree(workdir, ignore_errors=True)

    async def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if server.stdin is not None:
            server.stdin.close()
        try:
            await asyncio.wait_for(server.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                server.kill()
            await server.wait()
        if self._reader is not None:
            await self._reader
            self._reader = None

    async def aclose(self) -> None:
        """Stop the fork server (its running children belong to their episodes, which kill them)."""
        await self._stop_server()


async def _kill_group(pid: int, reaped: Any) -> None:
    """Kill the process group ``pid`` leads and wait until ``reaped`` (its exit) completes."""
    with contextlib.suppress(ProcessLookupError):  # it exited between the check and the kill
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):  # the server gone: the group is killed all the same
        await asyncio.wait_for(asyncio.shield(reaped), 10.0)
