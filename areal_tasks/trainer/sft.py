"""The SFT warm-start controller: ``run_sft(cfg) -> Path`` of the trained HF model.

It resolves the model (``tiny:<family>`` is built by the tiny-model kit), writes a worker config
with that directory as ``model.path`` to ``<run_dir>/sft_config.yaml``, and starts one
``areal_tasks.trainer.sft_worker`` per rank of the allocation's actor (its whole layout: the engine
runs the actor's dp x tp x sp, as in RL) through the Scheduler (``torch_distributed=True``; gloo on
CPU with the accelerators hidden). It waits for the group, raises
:class:`~areal_tasks.errors.WorkerFailedError` (exit codes, log tails) if a rank failed, and returns
``<run_dir>/sft``. The loop itself is in ``sft_loop.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.api.scheduler import Scheduler, WorkerGroupSpec
from areal_tasks.config.allocation import parse_allocation
from areal_tasks.config.serialize import dump_for_workers
from areal_tasks.errors import ConfigError, EngineError
from areal_tasks.launch.placement import plan_placement
from areal_tasks.models.tiny.spec import TINY_PREFIX

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

SFT_GROUP = "sft"


def resolve_model_dir(cfg: JobConfig) -> str:
    """A local directory of ``model.path``: ``tiny:<family>`` is built (or reused from the kit's cache)."""
    path = cfg.model.path
    if path.startswith(TINY_PREFIX):
        from areal_tasks.models import build_tiny_model
        from areal_tasks.models.tiny.spec import parse_tiny_spec

        family, overrides = parse_tiny_spec(path)
        return str(build_tiny_model(family, seed=cfg.experiment.seed, **overrides))
    if not Path(path).expanduser().is_dir():
        raise ConfigError(f"model.path={path!r}: SFT needs a local model directory or tiny:<family>")
    return str(Path(path).expanduser().resolve())


def actor_world_size(cfg: JobConfig) -> int:
    """The actor's ranks in the allocation (d * t * p * c): one SFT worker each."""
    return parse_allocation(cfg.allocation).actor().dims.world_size


def write_worker_config(cfg: JobConfig, model_dir: str) -> tuple[Path, dict[str, str]]:
    """``<run_dir>/sft_config.yaml``: ``cfg`` with ``model.path`` set to the resolved ``model_dir``
    (redacted), and the environment that carries its secrets to the workers."""
    worker_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=model_dir))
    target = RunPaths.of(_run_dir(cfg)).sft_config
    target.parent.mkdir(parents=True, exist_ok=True)
    return target, dump_for_workers(worker_cfg, target)


def _run_dir(cfg: JobConfig) -> str:
    if cfg.experiment.run_dir is None:
        raise ConfigError("experiment.run_dir is not resolved; build the config with load_config()")
    return cfg.experiment.run_dir


def sft_worker_spec(
    cfg: JobConfig, config_path: Path, replicas: int, secrets: dict[str, str] | None = None
) -> WorkerGroupSpec:
    """The worker group of the SFT ranks (one process per rank of the actor's layout)."""
    on_gpus = cfg.cluster.gpus_per_node > 0
    return WorkerGroupSpec(
        name=SFT_GROUP,
        command=[sys.executable, "-m", "areal_tasks.trainer.sft_worker", "--config", str(config_path)],
        env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **dict(secrets or {})},
        replicas=replicas,
        ports_per_worker=0,
        devices_per_worker=1 if on_gpus else 0,
        hide_devices=not on_gpus,
        torch_distributed=True,
        placement=list(plan_placement(cfg.allocation, cfg.cluster).actor),
    )


def run_sft(cfg: JobConfig, scheduler: Scheduler | None = None, timeout_s: float | None = None) -> Path:
    """Run ``train.sft_warmup_steps`` SFT steps on the actor's dp ranks; return the HF model directory.

    With no ``scheduler`` the job's own (``cluster.scheduler``, on the run dir) is used and stopped
    at the end.
    """
    if cfg.train.sft_warmup_steps < 1:
        raise ConfigError(f"train.sft_warmup_steps={cfg.train.sft_warmup_steps} must be >= 1 to run SFT")
    run_dir = _run_dir(cfg)
    config_path, secrets = write_worker_config(cfg, resolve_model_dir(cfg))
    replicas = actor_world_size(cfg)
    owned = scheduler is None
    if scheduler is None:
        from areal_tasks.launch.registry import make_scheduler_for

        scheduler = make_scheduler_for(cfg)
    try:
        if owned:  # run_train probed the storage already when it passes its scheduler
            from areal_tasks.launch.probe_runner import preflight_storage

            preflight_storage(cfg, scheduler)
        logger.info("SFT: %d steps on %d rank(s); logs under %s/logs", cfg.train.sft_warmup_steps, replicas, run_dir)
        scheduler.start_group(sft_worker_spec(cfg, config_path, replicas, secrets))
        if timeout_s is None:
            from areal_tasks.trainer.progress_relay import wait_with_progress

            wait_with_progress(scheduler, SFT_GROUP)  # rank 0's progress bar on this terminal
        else:
            scheduler.wait(SFT_GROUP, timeout_s)
        scheduler.check(SFT_GROUP)
    finally:
        if owned:
            scheduler.stop_all()
    model_dir = RunPaths.of(run_dir).sft_model
    if not (model_dir / "config.json").is_file():
        raise EngineError(f"SFT workers exited cleanly but wrote no HF model under {model_dir}")
    return model_dir
