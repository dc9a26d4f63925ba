"""Load test of the embedded inference server: many clients, valid and hostile requests, bounded time.

Starts ``areal serve`` on 127.0.0.1 (the tiny Qwen2 by default, one CPU thread, a 256-token
context, every limit at its default, an admin key through the environment), then:

1. **unloaded**: ``--baseline-requests`` valid ``/generate`` requests one after another: the
   latency a lone client sees;
2. **loaded**: ``--clients`` concurrent clients for ``--duration-s`` seconds (at most
   ``--max-requests`` requests), each drawing its next request from the mix of ``load_requests.py``
   (valid generate and chat, bad types, unknown fields, ``n`` over the limit, bodies and prompts too
   big, caller-supplied templates, admin calls without the key, garbage and escaping weight paths,
   clients that disconnect after 0.2 s, bursts that fill the queue), while a sampler reads
   ``/health`` (its latency), ``/metrics`` (running and queued) and the server's RSS every 0.5 s;
3. **after**: how long until nothing runs or waits (the disconnected clients' work must have been
   aborted), one more valid request, then SIGTERM and how long the server takes to exit.

Reports per class the status histogram; the 5xx count (a hardened server has none); valid
p50/p95/p99 unloaded and loaded; 429s and their ``Retry-After``; ``/health`` latency; RSS at start,
peak and end; drain and stop times; whether the server was alive at the end. Prints a table and
writes JSON (``benchmarks/results/server_load_cpu.json`` by default). Importable: ``main(argv)``
returns the report (``tests/integration/inference_server/test_server_load_short.py`` runs a short
form and checks its structure). Like the other scripts it imports its sibling helpers
(``load_requests.py``, ``load_report.py``) with ``benchmarks/`` on ``sys.path``.

Usage::

    python benchmarks/server_load.py                          # one minute, 32 clients
    python benchmarks/server_load.py --duration-s 8 --clients 6 --baseline-requests 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from load_report import print_report, summarize
from load_requests import FLOOD, KINDS, Kind, LoadContext, Outcome, valid_generate_body

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN_KEY_ENV = "AREAL_LOAD_ADMIN_KEY"
_METRIC = re.compile(r"^(sglang:num_(?:running|queue)_reqs)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def serve_flags() -> str:
    """``areal serve --help``: which flags this tree's server has (the weight roots are newer)."""
    out = subprocess.run(
        [sys.executable, "-m", "areal_tasks.cli", "serve", "--help"], capture_output=True, text=True, check=False
    )
    return out.stdout


class Server:
    """``areal serve`` in a session of its own, stopped by its process group."""

    def __init__(self, model: Path, log: Path, context_length: int, extra: list[str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_key = secrets.token_urlsafe(24)
        argv = [
            sys.executable,
            "-m",
            "areal_tasks.cli",
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--device",
            "cpu",
            "--num-threads",
            "1",
            "--context-length",
            str(context_length),
            "--admin-api-key-env",
            ADMIN_KEY_ENV,
            *extra,
        ]
        env = {**os.environ, ADMIN_KEY_ENV: self.admin_key, "TOKENIZERS_PARALLELISM": "false"}
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"areal serve exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"areal serve not healthy after {timeout_s:g} s; see {self.log}")

    def stop(self, timeout_s: float) -> tuple[float | None, bool]:
        """SIGTERM the server; ``(seconds to exit or None, SIGKILL needed)``."""
        if self.proc.poll() is not None:
            return 0.0, False
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
            return time.monotonic() - started, False
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            return None, True

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


class Sampler(threading.Thread):
    """Every ``period_s``: ``/health`` status and latency, running/queued requests, the server's RSS."""

    def __init__(self, server: Server, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.server, self.period_s = server, period_s
        self.samples: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while not self._halt.wait(self.period_s):
                self.samples.append(sample(client, self.server))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)


def sample(client: httpx.Client, server: Server) -> dict[str, Any]:
    """One reading of the server's health, queue and memory."""
    out: dict[str, Any] = {"t": time.monotonic(), "rss_mib": _rss_mib(server.proc.pid)}
    started = time.monotonic()
    try:
        out["health"] = client.get(f"{server.url}/health").status_code
    except httpx.HTTPError:
        out["health"] = None
    out["health_s"] = time.monotonic() - started
    try:
        metrics = {m: float(v) for m, v in _METRIC.findall(client.get(f"{server.url}/metrics").text)}
    except httpx.HTTPError:
        metrics = {}
    out["running"] = metrics.get("sglang:num_running_reqs")
    out["queued"] = metrics.get("sglang:num_queue_reqs")
    return out


async def _timed(kind: Kind, client: httpx.AsyncClient, ctx: LoadContext, rng: random.Random) -> dict[str, Any]:
    started = time.monotonic()
    try:
        if kind.own_client:
            limits = httpx.Limits(max_connections=FLOOD + 8, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=client.timeout, limits=limits) as own:
                outcome = await kind.send(own, ctx, rng)
        else:
            outcome = await kind.send(client, ctx, rng)
    except httpx.HTTPError as exc:
        outcome, error = Outcome(None), type(exc).__name__
        detail = f"{exc!r} <- {exc.__context__!r}"
    else:
        error = detail = None
    return {
        "kind": kind.name,
        "status": outcome.status,
        "retry_after": outcome.retry_after,
        "latency_s": time.monotonic() - started,
        "error": error,
        "detail": detail,
    }


async def baseline(ctx: LoadContext, n: int, seed: int) -> list[float]:
    """Latencies of ``n`` valid requests, one at a time."""
    rng = random.Random(seed)
    out = []
    async with httpx.AsyncClient(timeout=120.0) as client:
        for _ in range(n):
            started = time.monotonic()
            response = await client.post(f"{ctx.url}/generate", json=valid_generate_body(rng, ctx))
            response.raise_for_status()
            out.append(time.monotonic() - started)
    return out


async def load(ctx: LoadContext, clients: int, duration_s: float, max_requests: int, seed: int) -> list[dict]:
    """``clients`` concurrent clients drawing from the mix until the time or the request budget is spent."""
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + duration_s
    weights = [k.share for k in KINDS]

    async def one_client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0)) as client:
            while time.monotonic() < deadline and len(records) < max_requests:
                kind = rng.choices(KINDS, weights)[0]
                records.append(await _timed(kind, client, ctx, rng))

    tasks = [asyncio.create_task(one_client(i)) for i in range(clients)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=duration_s + 90.0)
    except (TimeoutError, asyncio.TimeoutError):
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return records


def wait_drained(server: Server, timeout_s: float) -> float | None:
    """Seconds until nothing runs or waits on the server (None: not within ``timeout_s``)."""
    started = time.monotonic()
    with httpx.Client(timeout=10.0) as client:
        while time.monotonic() - started < timeout_s:
            reading = sample(client, server)
            if reading["running"] == 0 and reading["queued"] == 0:
                return time.monotonic() - started
            time.sleep(0.2)
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF model directory (default: the tiny qwen2)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--max-requests", type=int, default=20000)
    parser.add_argument("--baseline-requests", type=int, default=50)
    parser.add_argument("--context-length", type=int, default=256)
    parser.add_argument("--drain-timeout-s", type=float, default=60.0)
    parser.add_argument("--stop-timeout-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `areal serve` argument (repeat)")
    parser.add_argument("--out", type=Path, default=RESULTS / "server_load_cpu.json")
    args = parser.parse_args(argv)
    if args.model is None:
        from areal_tasks.models import build_tiny_model

        args.model = Path(build_tiny_model("qwen2"))
    with tempfile.TemporaryDirectory(prefix="server_load_") as scratch:
        garbage = Path(scratch) / "garbage"
        garbage.mkdir()
        (garbage / "model.safetensors").write_bytes(os.urandom(4096))
        (garbage / "config.json").write_text("{}")
        extra = list(args.server_arg)
        if "--weight-root" in serve_flags():  # a server that confines weight paths: let the garbage reach the loader
            extra += ["--weight-root", str(garbage)]
        server = Server(args.model, Path(scratch) / "server.log", args.context_length, extra)
        try:
            report = _run(server, args, garbage)
        except BaseException:
            print(f"server log tail:\n{server.log.read_text(errors='replace')[-4000:]}", file=sys.stderr)
            raise
        finally:
            server.kill()
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return report


def _run(server: Server, args: argparse.Namespace, garbage: Path) -> dict[str, Any]:
    server.wait_healthy(180.0)
    ctx = LoadContext(server.url, server.admin_key, str(args.model), str(garbage), args.context_length)
    base = asyncio.run(baseline(ctx, args.baseline_requests, args.seed))
    sampler = Sampler(server)
    sampler.start()
    started = time.monotonic()
    try:
        records = asyncio.run(load(ctx, args.clients, args.duration_s, args.max_requests, args.seed))
    finally:
        load_wall = time.monotonic() - started
        sampler.stop()
    drain = wait_drained(server, args.drain_timeout_s)
    try:
        after = httpx.post(f"{server.url}/generate", json=valid_generate_body(random.Random(1), ctx), timeout=60)
        alive = after.status_code == 200 and server.proc.poll() is None
    except httpx.HTTPError:
        alive = False
    stop_s, killed = server.stop(args.stop_timeout_s)
    return summarize(
        records,
        base,
        sampler.samples,
        clients=args.clients,
        duration_s=args.duration_s,
        load_wall_s=load_wall,
        drain_s=drain,
        alive_at_end=alive,
        stop_s=stop_s,
        sigkill_needed=killed,
        model=str(args.model),
        context_length=args.context_length,
    )


if __name__ == "__main__":
    main()
