"""The HTTP runs of the inference throughput benchmark (``inference_throughput.py --http``): ``areal
serve`` started once on a free loopback port (:func:`serving`, also used by ``http_client_cost.py``)
and stopped by PID, and an :class:`HttpClient` that sends every row's requests as concurrent
``/generate`` calls through the RL client's transport, on one event loop and one connection pool
kept across the rows (as the long-lived client of an RL run keeps them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inference_runs import ANATOMY_COUNTERS, decode_anatomy  # benchmarks/, the script's directory


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags :func:`serving` passes on to ``areal serve`` (None: the server's own default)."""
    from areal_tasks.inference.server.server import HTTP_FRONTENDS

    parser.add_argument(
        "--server-http-frontend",
        choices=HTTP_FRONTENDS,
        default=None,
        help="areal serve's --http-frontend (default: the server's own)",
    )
    parser.add_argument(
        "--server-switch-interval-us",
        type=float,
        default=None,
        metavar="US",
        help="areal serve's --switch-interval-us (default: the server's own)",
    )


@contextlib.contextmanager
def serving(
    model_dir: Path,
    args: argparse.Namespace,
    max_running_requests: int | None = None,
    max_prefill_tokens: int | None = None,
    prefix_cache: bool = False,
) -> Iterator[tuple[str, int]]:
    """``areal serve`` on ``model_dir`` (a free loopback port, the benchmark's shape and threads;
    ``max_running_requests`` slots, ``args.concurrency`` when None), yielding its URL and PID once
    ``/health`` answers; stopped by PID on exit."""
    import httpx

    from areal_tasks.errors import InferenceError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--max-running-requests",
        str(max_running_requests or args.concurrency),
        "--context-length",
        str(args.prompt_len + args.new_tokens + 8),
    ]
    if max_prefill_tokens is not None:
        argv += ["--max-prefill-tokens", str(max_prefill_tokens)]
    if prefix_cache:
        argv.append("--enable-prefix-cache")
    if args.num_threads:
        argv += ["--num-threads", str(args.num_threads)]
    if getattr(args, "server_http_frontend", None) is not None:
        argv += ["--http-frontend", args.server_http_frontend]
    if getattr(args, "server_switch_interval_us", None) is not None:
        argv += ["--switch-interval-us", str(args.server_switch_interval_us)]
    if args.disable_torch_compile:
        argv.append("--disable-torch-compile")
    with tempfile.NamedTemporaryFile(prefix="areal_serve_", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            while True:
                if proc.poll() is not None:
                    tail = Path(log.name).read_text(errors="replace")[-3000:]
                    raise InferenceError(
                        f"areal serve exited with {proc.returncode}; its log ({log.name}) ends:\n{tail}"
                    )
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.5)
            yield url, proc.pid
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)


class HttpClient:
    """Concurrent ``/generate`` calls to ``url`` through the RL client's own transport (aiohttp,
    see ``areal_tasks/inference/client/http_backends.py``), on one event loop kept open between
    calls of :meth:`timed` so the connections stay open. Use as a context manager."""

    def __init__(self, url: str, max_connections: int) -> None:
        from areal_tasks.inference.client.transport import HttpTransport

        self.url = url
        self._loop = asyncio.Runner()
        self._transport = HttpTransport(max_connections=max_connections)

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.run(self._transport.aclose())
        finally:
            self._loop.close()

    async def _run(self, prompts: list[list[int]], new_tokens: int, sampling: dict, n: int) -> float:
        from areal_tasks.errors import InferenceError
        from areal_tasks.inference.client.protocol import HttpCall

        params = {**sampling, "max_new_tokens": new_tokens, "ignore_eos": True, "n": n}
        start = time.perf_counter()
        answers = await asyncio.gather(
            *(
                self._transport.send(
                    self.url, HttpCall("POST", "/generate", {"input_ids": p, "sampling_params": params}), 3600.0
                )
                for p in prompts
            )
        )
        elapsed = time.perf_counter() - start
        if failed := [(status, payload) for status, payload in answers if status != 200]:
            raise InferenceError(f"{len(failed)} /generate calls failed, the first with {failed[0]}")
        got = sum(_completion_tokens(payload) for _, payload in answers)
        if got != len(prompts) * n * new_tokens:
            raise InferenceError(
                f"/generate answered {got} tokens, not {len(prompts)} x {n} x {new_tokens}; "
                "the server's context must hold --prompt-len + --new-tokens"
            )
        return elapsed

    def timed(
        self, prompts: list[list[int]], new_tokens: int, sampling: dict, repeats: int, n: int = 1
    ) -> tuple[float, dict]:
        """Every prompt as a concurrent ``/generate`` call asking for ``n`` samples: a warm-up of
        4 tokens (the server meets the row's admission and sampling shapes, as the engine runs
        do), then the fastest of ``repeats`` timed runs: (seconds, the server engine's
        :func:`~inference_runs.decode_anatomy` over that run, from its ``/metrics``)."""
        self._loop.run(self._run(prompts, 4, sampling, n))
        best: tuple[float, dict] | None = None
        for _ in range(repeats):
            before = self._counters()
            seconds = self._loop.run(self._run(prompts, new_tokens, sampling, n))
            anatomy = decode_anatomy(before, self._counters(), seconds)
            if best is None or seconds < best[0]:
                best = (seconds, anatomy)
        assert best is not None
        return best

    def _counters(self) -> dict[str, float]:
        """The server engine's :data:`~inference_runs.ANATOMY_COUNTERS` from its ``/metrics``."""
        import httpx

        text = httpx.get(f"{self.url}/metrics", timeout=30).raise_for_status().text
        return metric_counters(text)


def metric_counters(text: str) -> dict[str, float]:
    """:data:`~inference_runs.ANATOMY_COUNTERS` from a ``/metrics`` page (``sglang:`` or ``areal:``
    names, one sample each); a counter the server does not expose is an error naming it."""
    from areal_tasks.errors import InferenceError

    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        key = name.split("{", 1)[0].split(":", 1)[-1]
        if key in ANATOMY_COUNTERS:
            values[key] = float(value)
    if missing := [key for key in ANATOMY_COUNTERS if key not in values]:
        raise InferenceError(f"the server's /metrics lacks {missing}; is it an older areal serve?")
    return values


def _completion_tokens(payload: Any) -> int:
    """Generated tokens of one ``/generate`` answer: an object, or a list of them for ``n > 1``."""
    answers = payload if isinstance(payload, list) else [payload]
    return sum(int(a["meta_info"]["completion_tokens"]) for a in answers)
