"""Harness of the embedded-server HTTP tests: start/stop ``areal serve``, reference outputs.

:func:`running_server` binds 127.0.0.1 on a free port, waits for ``/health`` (failing with the log
tail if the process dies first), and stops the process by its PID (SIGTERM, then SIGKILL);
:func:`running_process` is the same, yielding the process too (tests that signal it themselves).
:func:`hf_greedy` is transformers' greedy continuation, the reference for the server's output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ADMIN_KEY = "test-admin-key"
_STARTUP_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


@contextlib.contextmanager
def running_server(model_dir: Path, log_path: Path, *extra_args: str) -> Iterator[str]:
    """Run ``areal serve`` on ``model_dir``; yields its base URL."""
    with running_process(model_dir, log_path, *extra_args) as (url, _):
        yield url


@contextlib.contextmanager
def running_process(model_dir: Path, log_path: Path, *extra_args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run ``areal serve`` on ``model_dir``; yields its base URL and its process."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "serve",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--num-threads",
        "1",
        *extra_args,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _STARTUP_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"areal serve exited with {proc.returncode}:\n{_log_tail(log_path)}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"areal serve not healthy after {_STARTUP_S} s:\n{_log_tail(log_path)}")
            time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (EOS ignored)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
