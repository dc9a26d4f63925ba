"""A small launcher for multi-process tests (gloo on CPU, NCCL on GPUs): N subprocesses running one worker function.

``run_workers("workers_fsdp:dp_grads", world_size=2, args={...}, out_dir=tmp)`` starts
``python launch.py`` once per rank with torchrun-style environment variables; each child joins a
gloo process group, calls ``workers_fsdp.dp_grads(rank, world_size, out_dir, **args)`` and exits.
Results travel through files in ``out_dir`` (``torch.save``). A failing rank fails the call with its
exit code and the tail of its output; a hung rank is killed at ``timeout_s``.

Subprocesses instead of ``torch.multiprocessing.spawn``: worker code is found by module name in this
directory, independent of how pytest imported the test module.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class WorkerError(RuntimeError):
    """A worker process failed or timed out."""


#: ports already handed out by this process: a test that picks a port of its own (a weight-update
#: group's store) and then launches workers (``MASTER_PORT``) must not get the same one twice, which
#: the kernel may return for two binds to port 0 once the first socket is closed.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one this process was given before."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def run_workers(
    target: str,
    world_size: int,
    out_dir: Path,
    args: dict[str, Any] | None = None,
    timeout_s: float = 240.0,
    backend: str = "gloo",
) -> None:
    """Run ``target`` (``module:function`` in this directory) on ``world_size`` ranks.

    ``backend="gloo"`` hides the GPUs (CPU tests); ``"nccl"`` gives rank ``r`` GPU ``r``.
    """
    port = free_port()
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world_size):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            AREAL_TEST_BACKEND=backend,
            PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")]),
        )
        if backend == "gloo":
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = open(out_dir / f"rank{rank}.log", "w")
        cmd = [sys.executable, str(Path(__file__).resolve()), target, str(out_dir), json.dumps(args or {})]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failures = []
    for rank, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for other, _ in procs:
                if other.poll() is None:
                    other.kill()
            code = "timeout"
        log.close()
        if code != 0:
            tail = (out_dir / f"rank{rank}.log").read_text()[-4000:]
            failures.append(f"rank {rank} exited with {code}:\n{tail}")
    if failures:
        raise WorkerError("\n\n".join(failures))


def _main() -> None:
    import torch.distributed as dist

    target, out_dir, raw_args = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    logging.basicConfig(level=logging.INFO, format=f"[rank{os.environ['RANK']}] %(name)s: %(message)s")
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    backend = os.environ.get("AREAL_TEST_BACKEND", "gloo")
    if backend == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    try:
        func(dist.get_rank(), dist.get_world_size(), out_dir, **raw_args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _main()
