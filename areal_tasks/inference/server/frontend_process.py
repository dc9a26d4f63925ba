"""The engine process's side of ``--http-frontend process``: the front end's start, watch and stop.

:class:`HttpFrontEnd` makes a private directory (0700), listens there on the bridge socket
(``bridge_engine.py``), starts ``python -m areal_tasks.inference.server.frontend`` on the public
host and port, and waits until it reports that it accepts connections (``READY``). A front end
that exits first (the port is taken, say) fails the start with its exit code, and its log lines
are in this process's log. :func:`install_front_end` ties that to the app's lifespan: the front end
starts once the engine runs and stops before it, so the requests the front end still drains are
answered. After the start, a front end that dies stops this process too (SIGTERM to itself, the
same bounded stop as a signal): a server nobody can reach is no server. The engine process itself
serves uvicorn on a Unix socket in the private directory (nothing connects there; uvicorn runs the
lifespan and the signal handling as in one process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.bridge_engine import BridgeServer

logger = logging.getLogger(__name__)

__all__ = ["FRONT_END_START_TIMEOUT_S", "HttpFrontEnd", "install_front_end"]

#: seconds the front end may take to accept connections (it imports uvicorn and binds the port).
FRONT_END_START_TIMEOUT_S = 60.0


class HttpFrontEnd:
    """The HTTP front-end process of one ``areal serve`` (see the module doc)."""

    def __init__(
        self, host: str, port: int, *, max_body_bytes: int, shutdown_timeout_s: float, log_level: str = "info"
    ) -> None:
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.shutdown_timeout_s = shutdown_timeout_s
        self.log_level = log_level
        self.directory = Path(tempfile.mkdtemp(prefix="areal_serve_"))  # 0700: only this user connects
        self.bridge_path = str(self.directory / "bridge.sock")
        self.engine_socket = str(self.directory / "engine.sock")
        self.process: subprocess.Popen[bytes] | None = None
        self.bridge: BridgeServer | None = None
        self.failure: str | None = None
        self._stopping = False
        self._serving = False
        self._lost_task: asyncio.Future[None] | None = None
        #: starts this process's bounded stop, as SIGTERM does (``serve_until_stopped``'s ``on_serving``)
        self.stop_server: Callable[[], None] | None = None

    def argv(self) -> list[str]:
        """The front end's command line (no keys: the app checks them in this process)."""
        return [
            sys.executable,
            "-m",
            "areal_tasks.inference.server.frontend",
            "--bridge",
            self.bridge_path,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-body-bytes",
            str(self.max_body_bytes),
            "--shutdown-timeout-s",
            str(self.shutdown_timeout_s),
            "--log-level",
            self.log_level,
        ]

    async def start(self, app: Any) -> None:
        """Bridge ``app``, start the front end and wait until it accepts connections."""
        self.bridge = BridgeServer(app, self.bridge_path, on_lost=self._lost)
        await self.bridge.start()
        self.process = subprocess.Popen(self.argv())
        waiting = asyncio.ensure_future(self.bridge.ready.wait())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FRONT_END_START_TIMEOUT_S
        try:
            while not waiting.done():
                if (code := self.process.poll()) is not None:
                    raise InferenceError(
                        f"the HTTP front end on {self.host}:{self.port} exited with {code} before it served "
                        "(its log lines above say why; a port in use is the common cause)"
                    )
                if loop.time() > deadline:
                    raise InferenceError(
                        f"the HTTP front end on {self.host}:{self.port} did not accept connections "
                        f"within {FRONT_END_START_TIMEOUT_S:g} s"
                    )
                await asyncio.wait({waiting}, timeout=0.05)
        except BaseException as exc:
            waiting.cancel()
            self.failure = str(exc)
            await self.stop(timeout_s=5.0)
            raise
        self._serving = True
        logger.info("HTTP front end (pid %d) serving on http://%s:%d", self.process.pid, self.host, self.port)

    def set_stopper(self, stop: Callable[[], None]) -> None:
        """Use ``stop`` to stop this process when the front end dies (see :meth:`_stop_server`)."""
        self.stop_server = stop

    def _lost(self) -> None:
        if self._stopping or not self._serving:  # before it served, start() reports the exit itself
            return
        self._lost_task = asyncio.ensure_future(self._stop_server())

    async def _stop_server(self) -> None:
        """The front end's stream ended while serving: say how it exited, then stop this process
        as SIGTERM would (unless its stop began meanwhile: a signal to the process group reaches
        the front end first)."""
        code = None
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = await asyncio.to_thread(self.process.wait, 2.0)
        if self._stopping:
            return
        if code == 0:  # it was told to stop: so is this process
            logger.info("the HTTP front end stopped (exit 0): stopping the server")
        else:
            logger.error("the HTTP front end is gone (exit %s): stopping the server", code)
        if self.stop_server is not None:
            self.stop_server()
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    async def stop(self, timeout_s: float) -> None:
        """Stop the front end (it answers what it has in flight, within ``timeout_s``), then the bridge."""
        self._stopping = True
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("the HTTP front end did not stop within %.1f s: killed", timeout_s)
                process.kill()
                await asyncio.to_thread(process.wait, 5.0)
        if self.bridge is not None:
            await self.bridge.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def install_front_end(app: Any, front_end: HttpFrontEnd, stop_timeout_s: float) -> None:
    """Start ``front_end`` once ``app``'s lifespan has started the engine, and stop it (within
    ``stop_timeout_s``) before the engine stops."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[None]:
        async with inner(app_):
            await front_end.start(app)
            try:
                yield
            finally:
                await front_end.stop(stop_timeout_s)

    app.router.lifespan_context = lifespan
