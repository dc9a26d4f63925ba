"""One inference server for a model, for as long as a ``with`` block: what evaluations run on.

:func:`one_server` starts the job's ``rollout.backend`` command line (embedded by default, vLLM or
SGLang when the config says so) for ``model_dir`` through :class:`ServerFleet` and the job's
Scheduler (a local one made here when none is given, stopped at the end), waits for its health
check, yields a :class:`ServedModel` and stops the server however the block ends. Both the
checkpoint evaluation (:mod:`areal_tasks.trainer.evaluate`) and the evaluation harness
(:mod:`areal_tasks.evaluation.harness`) serve their model through it, so a server is launched,
keyed and placed the same way for both.

Torch-free: the server is another process.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from areal_tasks.inference.launch.commands import build_server_command, key_servers_off_loopback
from areal_tasks.inference.launch.fleet import ServerFleet

if TYPE_CHECKING:
    from areal_tasks.api.scheduler import Scheduler
    from areal_tasks.config.job import JobConfig
    from areal_tasks.inference.client import RemoteInferenceEngine

logger = logging.getLogger(__name__)

__all__ = ["ServedModel", "one_server"]


@dataclass(frozen=True)
class ServedModel:
    """The running server's ``addresses`` and the config its clients use (``cfg``: the job's, with
    the API key a server off loopback needs)."""

    cfg: JobConfig
    addresses: list[str]

    def engine(self) -> RemoteInferenceEngine:
        """A client of the server with the job's ``rollout`` settings (close it with ``aclose``)."""
        from areal_tasks.inference.client import RemoteInferenceEngine

        return RemoteInferenceEngine.from_rollout(self.cfg.rollout, self.addresses)


@contextlib.contextmanager
def one_server(
    cfg: JobConfig, model_dir: str, *, scheduler: Scheduler | None = None, name: str = "eval"
) -> Iterator[ServedModel]:
    """Serve ``model_dir`` with one ``cfg.rollout.backend`` server while the block runs.

    The server gets one accelerator on a GPU cluster (none, and the host's hidden, on CPU), the
    config's ``rollout.server.startup_timeout_s`` and no restarts. Without ``scheduler`` one is
    made for ``cfg`` (:func:`~areal_tasks.launch.registry.make_scheduler_for`) and stopped after.
    """
    cfg = key_servers_off_loopback(cfg, os.environ)  # servers on a cluster's nodes need an API key
    owned = scheduler is None
    if scheduler is None:
        from areal_tasks.launch.registry import make_scheduler_for

        scheduler = make_scheduler_for(cfg)
    on_gpus = cfg.cluster.gpus_per_node > 0
    try:
        fleet = ServerFleet(
            scheduler,
            build_server_command(cfg, model_dir),
            1,
            name=name,
            devices_per_server=1 if on_gpus else 0,
            hide_devices=not on_gpus,
            startup_timeout_s=cfg.rollout.server.startup_timeout_s,
            max_restarts=0,
        )
        try:
            addresses = fleet.start()
            logger.info("%s server for %s at %s", cfg.rollout.backend, model_dir, ", ".join(addresses))
            yield ServedModel(cfg, addresses)
        finally:
            fleet.stop()
    finally:
        if owned:
            scheduler.stop_all()
