"""``ProxyServer``: the agent proxy served by uvicorn on the caller's running event loop.

``await server.start()`` binds ``host:port`` (port 0: a free port; :attr:`ProxyServer.url` names
the one bound) before uvicorn starts, runs ``uvicorn.Server.serve()`` as a task of the running
loop and the session sweeper beside it, and returns once uvicorn accepts connections. uvicorn is
kept off the process's signals: the owner decides when to stop (``areal proxy`` on SIGINT/SIGTERM,
a workflow when its episodes are done). ``await server.stop()`` ends every open session (their
groups are queued as usual), then stops uvicorn, cancelling requests still in flight after
``graceful_s``.

``server.sessions`` (:class:`~areal_tasks.agent.proxy.store.SessionStore`) is the in-process
session API: ``start_session()``, ``end_session(id)``, ``next_group(timeout)``; it needs no key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from areal_tasks.agent.proxy.auth import AdminAuth
from areal_tasks.agent.proxy.limits import ProxyLimits
from areal_tasks.agent.proxy.session import SessionResult
from areal_tasks.agent.proxy.store import SessionStore
from areal_tasks.errors import AgentError

logger = logging.getLogger(__name__)

__all__ = ["ProxyServer"]

#: seconds ``start`` waits for uvicorn to accept connections.
START_TIMEOUT_S = 30.0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AgentError(f"the agent proxy cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the proxy's owner decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ProxyServer:
    """An OpenAI-compatible proxy over ``engine`` whose sessions each record their completions.

    ``make_client`` (optional) builds one session's client (default: ``ArealOpenAI(engine,
    tokenizer, sampling=..., tool_call_parser=..., chat_template_kwargs=..., model_name=...)``);
    ``on_group`` is called with each finished session's result (e.g. a JSONL export);
    ``queue_groups=False`` keeps results out of ``sessions.next_group`` (for in-process callers
    that take each result from ``sessions.end_session``).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        admin_api_key: str | None,
        sampling: Any = None,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ProxyLimits | None = None,
        allow_unauthenticated_admin: bool = False,
        tool_call_parser: str = "hermes",
        chat_template_kwargs: dict[str, Any] | None = None,
        model_name: str = "areal",
        on_group: Callable[[SessionResult], None] | None = None,
        make_client: Callable[[], Any] | None = None,
        queue_groups: bool = True,
        graceful_s: float = 5.0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.host = host
        self.port = port
        self.model_name = model_name
        self.graceful_s = graceful_s
        self._client_kwargs = {
            "sampling": sampling,
            "tool_call_parser": tool_call_parser,
            "chat_template_kwargs": chat_template_kwargs,
            "model_name": model_name,
        }
        self.admin = AdminAuth(admin_api_key, allow_unauthenticated_admin)
        self.sessions = SessionStore(
            make_client or self._make_client, limits, on_group=on_group, queue_groups=queue_groups
        )
        self._uvicorn: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def _make_client(self) -> Any:
        from areal_tasks.agent.client import ArealOpenAI

        return ArealOpenAI(self.engine, self.tokenizer, **self._client_kwargs)

    @property
    def limits(self) -> ProxyLimits:
        return self.sessions.limits

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound socket (after :meth:`start`)."""
        if self._serving is None:
            raise AgentError("the agent proxy has not started: await start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Serve on the running loop (see the module doc); AgentError if it cannot start."""
        from areal_tasks.agent.proxy.app import ProxyContext, create_app

        if self._serving is not None:
            raise AgentError("the agent proxy is already started")
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        app = create_app(ProxyContext(self.sessions, self.admin, self.model_name))
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=75,
            timeout_graceful_shutdown=self.graceful_s,
        )
        self._uvicorn = _QuietServer(config)
        self._serving = asyncio.ensure_future(self._serve(sock))
        self._sweeper = asyncio.ensure_future(self._sweep())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if self._serving.done() or loop.time() > deadline:
                await self._halt()
                raise AgentError(f"the agent proxy did not start on {self.host}:{self.port}")
            await asyncio.sleep(0.01)
        logger.info("agent proxy serving on %s", self.url)

    async def _serve(self, sock: socket.socket) -> None:
        try:
            await self._uvicorn.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process on a failed start-up
            logger.error("the agent proxy's uvicorn stopped at start-up (exit %s)", exc.code)
        finally:
            sock.close()

    async def _sweep(self) -> None:
        interval = self.limits.sweep_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                self.sessions.sweep()
            except Exception:  # a failed sweep is logged; the next one tries again
                logger.exception("the agent proxy's session sweep failed")

    async def stop(self) -> None:
        """End every open session, then stop serving (bounded by ``graceful_s`` plus a margin)."""
        if self._serving is None:
            return
        try:
            await self.sessions.close()
        finally:
            await self._halt()

    async def _halt(self) -> None:
        sweeper, serving = self._sweeper, self._serving
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        if serving is None:
            return
        self._uvicorn.should_exit = True
        done, _ = await asyncio.wait({serving}, timeout=self.graceful_s + 5.0)
        if not done:
            logger.warning("the agent proxy did not stop in time; cancelling it")
            self._uvicorn.force_exit = True
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        self._serving = None
        self._sweeper = None
        logger.info("agent proxy on %s:%d stopped", self.host, self.port)

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()
