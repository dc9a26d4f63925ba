"""The SGLang backend of the protocol suite: a real ``sglang.launch_server`` started by ServerFleet.

Runs where SGLang is installed (set ``AREAL_SGLANG_PYTHON`` to the interpreter of an SGLang
environment, or install it in this one) and a CUDA device is present (SGLang serves on GPUs);
skipped otherwise. SGLang reports per-token weight versions, so the suite checks them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from inference_suite import BackendSpec, ServerControl, register_backend


def _sglang_python() -> str | None:
    """An interpreter that can import sglang, or None."""
    candidate = os.environ.get("AREAL_SGLANG_PYTHON") or sys.executable
    if not shutil.which(candidate) and not os.path.exists(candidate):
        return None
    probe = subprocess.run([candidate, "-c", "import sglang"], capture_output=True, timeout=120)
    return candidate if probe.returncode == 0 else None


def _missing_reason() -> str | None:
    python = _sglang_python()
    if python is None:
        return "SGLang is not installed (set AREAL_SGLANG_PYTHON to an SGLang environment's python)"
    if not shutil.which("nvidia-smi"):
        return "SGLang serves on CUDA devices; none here"
    return None


@contextlib.contextmanager
def start_sglang(workdir: Path, model_dir: Path) -> Iterator[ServerControl]:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.inference.launch import ServerFleet
    from areal_tasks.launch import LocalScheduler

    cfg = JobConfig()
    cfg.allocation = "sglang:d1+fsdp:d1"
    cfg.rollout.backend = "sglang"
    cfg.cluster.gpus_per_node = 1
    cfg.rollout.server.python = _sglang_python()
    cfg.rollout.server.mem_fraction = 0.3
    cfg.rollout.server.extra_args = ["--disable-cuda-graph", "--log-level", "warning"]
    with (
        LocalScheduler(workdir / "run", handle_signals=False) as scheduler,
        ServerFleet.from_config(scheduler, cfg, str(model_dir)) as fleet,
    ):
        keys = dict(zip(("api_key", "admin_api_key"), cfg.rollout.server.read_keys(os.environ, "sglang")))
        yield ServerControl("sglang", fleet.addresses, model_dir, workdir, client_keys=keys)


_missing = _missing_reason()
register_backend(
    BackendSpec(
        "sglang",
        start_sglang,
        marks=(pytest.mark.gpu, pytest.mark.skipif(_missing is not None, reason=_missing or "")),
        features=frozenset({"collective", "server_versions"}),
    )
)
