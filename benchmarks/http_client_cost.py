"""The host cost of a ``/generate`` call on both sides of the wire: the RL client's transport
(aiohttp, the default, against the sharded httpx pools it replaced) and ``areal serve``.

``areal serve`` runs the kit's tiny Qwen2 (or ``--preset``'s shape) on a free loopback port. Each
round sends ``--concurrency`` concurrent ``/generate`` calls of ``--prompt-len`` random prompt tokens
and ``--new-tokens`` new tokens (1 by default: the calls, not the decoding, are what is measured),
``return_logprob`` on as RL asks; the first round of each backend is a warm-up (connections open).
Per call: the client's CPU (``time.process_time`` of this process, which does nothing else) and the
server's (user + system time of its process from ``/proc``: HTTP handling plus the engine's prefill
and one decode step), and calls per second of wall time. The client freezes its start-up heap
once the server is up, as the RL rollout process does (``gc_heap.py``; ``--unfrozen-client`` leaves
it, as before).

Prints a table and writes JSON (``benchmarks/results/http_client_cost_<device>.json`` by default).

Usage::

    python benchmarks/http_client_cost.py                        # CPU, tiny model, about a minute
    python benchmarks/http_client_cost.py --concurrency 256,1024 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from inference_http import add_server_arguments, serving  # benchmarks/ is first on sys.path
from inference_throughput import PRESETS, RESULTS, build_model_dir, make_prompts

from areal_tasks.gc_heap import freeze_startup_heap
from areal_tasks.inference.client.protocol import HttpCall
from areal_tasks.inference.client.transport import HttpTransport

BACKENDS = ("aiohttp", "httpx")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the child processes of ``pid`` (``--http-frontend process``:
    the front end), 0 when it has none."""
    total = 0.0
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            with contextlib.suppress(FileNotFoundError):  # ended between the listing and the read
                total += process_cpu_s(int(child))
    return total


def loop_thread_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the main thread of ``pid``: ``areal serve``'s event loop, the
    Python that competes with the engine thread for the interpreter lock."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def transport_for(backend: str, connections: int) -> HttpTransport:
    if backend == "aiohttp":
        return HttpTransport(max_connections=connections)
    return HttpTransport(max_connections=connections, transport_factory=httpx.AsyncHTTPTransport)


async def rounds(url: str, pid: int, backend: str, prompts: list[list[int]], new_tokens: int, n: int) -> list[dict]:
    """``n`` timed rounds (after one warm-up) of every prompt as a concurrent call."""
    transport = transport_for(backend, len(prompts))
    body = {
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
    }
    out = []
    try:
        for index in range(n + 1):
            client0, server0, wall0 = time.process_time(), process_cpu_s(pid), time.perf_counter()
            front0, loop0 = children_cpu_s(pid), loop_thread_cpu_s(pid)
            answers = await asyncio.gather(
                *(transport.send(url, HttpCall("POST", "/generate", {**body, "input_ids": p}), 600.0) for p in prompts)
            )
            wall = time.perf_counter() - wall0
            client, server = time.process_time() - client0, process_cpu_s(pid) - server0
            front, loop = children_cpu_s(pid) - front0, loop_thread_cpu_s(pid) - loop0
            bad = [status for status, _ in answers if status != 200]
            if bad:
                raise RuntimeError(f"{len(bad)} calls failed (status {bad[0]})")
            if index:  # round 0 opens the connections
                calls = len(prompts)
                out.append(
                    {
                        "wall_s": wall,
                        "calls_per_s": calls / wall,
                        "client_cpu_ms_per_call": 1000 * client / calls,
                        "server_cpu_ms_per_call": 1000 * server / calls,
                        "frontend_cpu_ms_per_call": 1000 * front / calls,
                        "server_loop_cpu_ms_per_call": 1000 * loop / calls,
                    }
                )
    finally:
        await transport.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("tiny", *PRESETS), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--concurrency", default="256,1024", help="comma-separated concurrent calls a round")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per backend and concurrency")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--disable-torch-compile", action="store_true")
    parser.add_argument(
        "--unfrozen-client",
        action="store_true",
        help="leave this client's start-up heap in the collector's sight (the RL rollout process freezes it)",
    )
    add_server_arguments(parser)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(args.preset, Path(tmp))
        args.concurrency = max(levels)  # the server's slots: the largest round fits at once
        with serving(model_dir, args) as (url, pid):
            if not args.unfrozen_client:
                freeze_startup_heap()  # as the RL rollout process does once its side is built (gc_heap.py)
            for level in levels:
                prompts = make_prompts(level, args.prompt_len, seed=level)
                for backend in BACKENDS:
                    runs = asyncio.run(rounds(url, pid, backend, prompts, args.new_tokens, args.rounds))
                    row = {"backend": backend, "concurrency": level, "runs": runs}
                    for key in (
                        "calls_per_s",
                        "client_cpu_ms_per_call",
                        "server_cpu_ms_per_call",
                        "frontend_cpu_ms_per_call",
                        "server_loop_cpu_ms_per_call",
                    ):
                        row[key] = statistics.median(run[key] for run in runs)
                    rows.append(row)
                    print(
                        f"measured: {backend} x {level}: {row['calls_per_s']:,.0f} calls/s, CPU a call: client "
                        f"{row['client_cpu_ms_per_call']:.3f} ms, server {row['server_cpu_ms_per_call']:.3f} ms, "
                        f"its event loop {row['server_loop_cpu_ms_per_call']:.3f} ms, "
                        f"its front end {row['frontend_cpu_ms_per_call']:.3f} ms",
                        flush=True,
                    )

    print(
        f"\n{args.preset} on {platform.machine()}, /generate of {args.prompt_len} prompt + {args.new_tokens} new tokens"
    )
    print(
        f"{'client transport':18s} {'in flight':>9s} {'calls/s':>9s} {'client ms CPU':>14s} {'server ms CPU':>14s} "
        f"{'its loop ms CPU':>16s} {'front end ms CPU':>17s}"
    )
    for row in rows:
        print(
            f"{row['backend']:18s} {row['concurrency']:9d} {row['calls_per_s']:9,.0f} "
            f"{row['client_cpu_ms_per_call']:14.3f} {row['server_cpu_ms_per_call']:14.3f} "
            f"{row['server_loop_cpu_ms_per_call']:16.3f} {row['frontend_cpu_ms_per_call']:17.3f}"
        )
    print(
        "(medians of the timed rounds; CPU per call: the client process / the server (engine) process / "
        "that process's event-loop thread, which shares the interpreter lock with the engine thread / "
        "its HTTP front-end process, with --server-http-frontend process)"
    )
    out = args.out or RESULTS / f"http_client_cost_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "preset": args.preset,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "client_heap_frozen": not args.unfrozen_client,
        "server_switch_interval_us": args.server_switch_interval_us,
        "server_http_frontend": args.server_http_frontend,
    }
    out.write_text(json.dumps({"config": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
