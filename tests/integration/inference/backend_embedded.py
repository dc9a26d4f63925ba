"""The embedded backend of the protocol suite: two ``areal serve`` processes started by ServerFleet.

As a job's, they run behind the job's generated admin key (read back for the clients) and load
disk updates only from the model and the suite's scratch directory (``rollout.server.weight_roots``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from inference_suite import BackendSpec, ServerControl, register_backend


@contextlib.contextmanager
def start_embedded(workdir: Path, model_dir: Path) -> Iterator[ServerControl]:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.inference.launch import ServerFleet
    from areal_tasks.launch import LocalScheduler

    cfg = JobConfig()
    cfg.allocation = "embedded:d2+fsdp:d1"
    cfg.model.dtype = "float32"
    cfg.rollout.server.startup_timeout_s = 300
    cfg.rollout.server.extra_args = ["--num-threads", "1", "--max-running-requests", "16", "--log-level", "warning"]
    cfg.rollout.server.weight_roots = [str(workdir)]
    with LocalScheduler(workdir / "run", devices=[], handle_signals=False) as scheduler:
        fleet = ServerFleet.from_config(scheduler, cfg, str(model_dir))
        with fleet:
            keys = dict(zip(("api_key", "admin_api_key"), cfg.rollout.server.read_keys(os.environ, "embedded")))
            yield ServerControl("embedded", fleet.addresses, model_dir, workdir, client_keys=keys)


register_backend(
    BackendSpec("embedded", start_embedded, features=frozenset({"collective", "server_versions", "shared"}))
)
