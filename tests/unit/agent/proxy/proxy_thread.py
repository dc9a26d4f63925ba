"""A :class:`ProxyServer` on its own event loop in a thread, for tests that drive it over HTTP.

The proxy, its engine and its sessions live on the thread's loop (as in a workflow's process);
tests talk to it with the official ``openai`` SDK and httpx from their own loop or synchronously,
and reach the in-process session API through :meth:`ProxyThread.call`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from areal_tasks.agent.proxy.server import ProxyServer

T = TypeVar("T")
WAIT_S = 60.0


class ProxyThread:
    """``build()`` (called on the thread's loop) makes the ProxyServer; ``start`` serves it."""

    def __init__(self, build: Callable[[], ProxyServer]) -> None:
        self._build = build
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxy-loop", daemon=True)
        self.server: ProxyServer | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT_S) -> T:
        """Run ``coro`` on the proxy's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ProxyThread:
        self._thread.start()

        async def up() -> ProxyServer:
            server = self._build()
            await server.start()
            return server

        self.server = self.call(up())
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def stop(self) -> None:
        try:
            if self.server is not None:
                self.call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(WAIT_S)
            self.loop.close()

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
