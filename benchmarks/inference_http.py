"""The HTTP run of the inference throughput benchmark (``inference_throughput.py --http``): ``areal
serve`` started on a free loopback port (:func:`serving`, also used by ``http_client_cost.py``), every
prompt sent as a concurrent ``/generate`` call through the RL client's transport, and the server
stopped by PID.
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


async def _http_run(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Every prompt as a concurrent ``/generate`` call through the RL client's own transport
    (aiohttp, see ``areal_tasks/inference/client/http_backends.py``), after a warm-up
    of every prompt for 4 tokens on the same transport: the timed calls find their connections
    open, as the long-lived client of an RL run does, and the engine has seen the admission shapes.
    Returns the timed run's seconds."""
    from areal_tasks.inference.client.protocol import HttpCall
    from areal_tasks.inference.client.transport import HttpTransport

    transport = HttpTransport(max_connections=len(prompts))

    async def run(tokens: int) -> float:
        body = {"sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}
        start = time.perf_counter()
        answers = await asyncio.gather(
            *(transport.send(url, HttpCall("POST", "/generate", {**body, "input_ids": p}), 3600.0) for p in prompts)
        )
        elapsed = time.perf_counter() - start
        if any(status != 200 for status, _ in answers):
            raise RuntimeError(f"/generate failed: {next(text for status, text in answers if status != 200)}")
        return elapsed

    try:
        await run(4)
        return await run(new_tokens)
    finally:
        await transport.aclose()


@contextlib.contextmanager
def serving(model_dir: Path, args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """``areal serve`` on ``model_dir`` (a free loopback port, the benchmark's shape and threads),
    yielding its URL and PID once ``/health`` answers; stopped by PID on exit."""
    import httpx

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
        str(args.concurrency),
        "--context-length",
        str(args.prompt_len + args.new_tokens + 8),
    ]
    if args.num_threads:
        argv += ["--num-threads", str(args.num_threads)]
    if args.disable_torch_compile:
        argv.append("--disable-torch-compile")
    with tempfile.NamedTemporaryFile(prefix="areal_serve_", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            while True:
                if proc.poll() is not None:
                    tail = Path(log.name).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"areal serve exited with {proc.returncode}; its log ({log.name}) ends:\n{tail}")
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


def run_http(model_dir: Path, args: argparse.Namespace, prompts: list[list[int]]) -> float:
    """Throughput through ``areal serve`` (started here on a free port, stopped by PID)."""
    with serving(model_dir, args) as (url, _):
        return asyncio.run(_http_run(url, prompts, args.new_tokens))
