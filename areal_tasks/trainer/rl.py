"""The RL controller: ``run_train(cfg) -> summary`` (what ``areal train`` runs).

Everything is started through one Scheduler and stopped at the end:

0. with ``cluster.nodes > 1``, the storage preflight through that scheduler: ``experiment.run_dir``
   and ``storage.url`` must be usable and shared from every node (``launch/probe_runner.py``), else
   the job fails before anything starts, naming the node;
1. resolve the model (``tiny:<family>`` is built by the kit);
2. the SFT warm start when ``train.sft_warmup_steps > 0`` (``run_sft``; reused when the run
   directory already holds its model and recovery is on, so a resumed run does not redo it);
3. the inference servers (``ServerFleet``, the allocation's inference component) on the starting
   policy;
4. one RL train worker per rank of the actor (``rl_worker``; torch.distributed) with the servers'
   addresses; while they run, the controller watches both groups: a failed worker or a server past
   its restarts stops the run with the worker's log tail;
5. ``<run_dir>/summary.json``: ``reward_before`` (the starting policy after any SFT, before the
   first RL step), ``reward_after``, ``steps``, ``wall_seconds`` and the SFT figures.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import INFERENCE_ADDRESSES_ENV, RunPaths
from areal_tasks.api.scheduler import Scheduler, WorkerGroupSpec
from areal_tasks.config.allocation import parse_allocation
from areal_tasks.config.serialize import dump_for_workers
from areal_tasks.errors import ConfigError, EngineError
from areal_tasks.launch.placement import plan_placement
from areal_tasks.launch.probe_runner import preflight_storage
from areal_tasks.trace import span
from areal_tasks.trace.env import finish_trace, start_trace, trace_environment
from areal_tasks.trainer.rl_run import rl_steps
from areal_tasks.trainer.sft import resolve_model_dir, run_sft

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

RL_GROUP = "rl"
#: seconds between two looks at the workers and the servers.
POLL_S = 2.0


def starting_policy(cfg: JobConfig, scheduler: Scheduler) -> tuple[str, dict[str, Any]]:
    """The model directory RL starts from (after the SFT warm start, if any) and SFT facts."""
    if cfg.train.sft_warmup_steps < 1:
        return resolve_model_dir(cfg), {}
    paths = RunPaths.of(cfg.experiment.run_dir)
    if cfg.recover.mode != "disabled" and (paths.sft_model / "config.json").is_file():
        logger.info("reusing the SFT warm start in %s (recover.mode=%s)", paths.sft_model, cfg.recover.mode)
        return str(paths.sft_model), {"sft_reused": True}
    started = time.perf_counter()
    model_dir = run_sft(cfg, scheduler)
    losses = [json.loads(line)["loss"] for line in paths.sft_metrics.read_text(encoding="utf-8").splitlines() if line]
    return str(model_dir), {
        "sft_steps": cfg.train.sft_warmup_steps,
        "sft_loss_first": losses[0],
        "sft_loss_last": losses[-1],
        "sft_wall_s": time.perf_counter() - started,
    }


def check_before_start(cfg: JobConfig) -> None:
    """Fail in a second, before any process starts: RL steps, the reward, the workflow, and the
    servers' API keys (each variable ``rollout.server.*_key_env`` names must be set: the servers and
    the train workers inherit this environment)."""
    from areal_tasks.rollout.rewards import resolve_reward
    from areal_tasks.rollout.workflows import check_workflow

    rl_steps(cfg)
    resolve_reward(cfg.rollout.reward.fn)
    check_workflow(cfg.rollout.workflow)
    cfg.rollout.server.read_keys(os.environ)


def colocated_devices(cfg: JobConfig, server_devices: list[list[str]]) -> list[list[str]] | None:
    """Per train rank, the GPU it shares with the inference servers when the allocation colocates
    the actor with them (``sglang[rollout]:d2|fsdp[actor]:d2``): the servers' devices in server
    order, one per rank. None when nothing is colocated or on CPU."""
    allocation = parse_allocation(cfg.allocation)
    actor = allocation.actor()
    if not allocation.actor_shares_inference_gpus() or cfg.cluster.gpus_per_node <= 0:
        return None
    ids = [d for devices in server_devices for d in devices]
    if len(ids) != actor.dims.world_size:
        raise ConfigError(
            f"allocation {cfg.allocation!r}: the actor's {actor.dims.world_size} ranks share the "
            f"inference servers' GPUs, but the servers hold {len(ids)} ({','.join(ids) or 'none'})"
        )
    return [[d] for d in ids]


def rl_worker_spec(
    cfg: JobConfig,
    config_path: Path,
    addresses: list[str],
    shared_devices: list[list[str]] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> WorkerGroupSpec:
    """One process per rank of the actor's allocation (gloo on CPU with accelerators hidden); with
    ``shared_devices`` each rank computes on the GPU it shares with a server (colocation).
    ``secrets`` (``$AREAL_CONFIG_SECRETS``, from :func:`dump_for_workers`) joins their environment:
    the config file they read is redacted."""
    world = parse_allocation(cfg.allocation).actor().dims.world_size
    on_gpus = cfg.cluster.gpus_per_node > 0
    return WorkerGroupSpec(
        name=RL_GROUP,
        command=[sys.executable, "-m", "areal_tasks.trainer.rl_worker", "--config", str(config_path)],
        env={
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            INFERENCE_ADDRESSES_ENV: ",".join(addresses),
            **trace_environment(cfg),
            **dict(secrets or {}),
        },
        replicas=world,
        ports_per_worker=0,
        devices_per_worker=1 if on_gpus else 0,
        hide_devices=not on_gpus,
        shared_devices=shared_devices,
        torch_distributed=True,
        placement=list(plan_placement(cfg.allocation, cfg.cluster).actor),
    )


def run_train(cfg: JobConfig, scheduler: Scheduler | None = None) -> dict[str, Any]:
    """Run the whole job (see the module docstring); returns the summary also written to the run dir.

    With ``trace.enabled`` the controller traces its own phases and, at the end (also after a
    failure), merges every process's spans into ``<run_dir>/trace.json``."""
    traced = start_trace(cfg, "controller")
    try:
        with span("job", "train"):
            return _run_train(cfg, scheduler)
    finally:
        if traced:
            finish_trace(cfg)


def _run_train(cfg: JobConfig, scheduler: Scheduler | None) -> dict[str, Any]:
    from areal_tasks.inference.launch import ServerFleet
    from areal_tasks.inference.launch.commands import key_servers_off_loopback

    cfg = key_servers_off_loopback(cfg, os.environ)  # servers on a cluster's nodes need an API key
    check_before_start(cfg)
    paths = RunPaths.of(cfg.experiment.run_dir)
    run_dir = paths.root
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    owned = scheduler is None
    if scheduler is None:
        from areal_tasks.launch.registry import make_scheduler_for

        scheduler = make_scheduler_for(cfg)
    try:
        preflight_storage(cfg, scheduler)  # several nodes: run dir and storage shared by all, else fail naming one
        node_names = [node.name for node in scheduler.nodes()]
        from areal_tasks.trainer.engines import check_layouts_fit_model

        check_layouts_fit_model(cfg, resolve_model_dir(cfg))  # before any server or worker starts
        with span("sft warm start", "train", steps=cfg.train.sft_warmup_steps):
            model_dir, sft_facts = starting_policy(cfg, scheduler)
        worker_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=model_dir))
        config_path = paths.rl_config
        secrets = dump_for_workers(worker_cfg, config_path)  # redacted file; the secrets go by env
        fleet = ServerFleet.from_config(scheduler, cfg, model_dir)
        try:
            with span("start servers", "server", n=fleet.n_servers):
                addresses = fleet.start()
            shared = colocated_devices(cfg, fleet.devices())
            with span("rl workers", "train"):
                scheduler.start_group(rl_worker_spec(cfg, config_path, addresses, shared, secrets))
                _watch(scheduler, fleet, paths.inference_servers)
        finally:
            with span("stop servers", "server"):
                fleet.stop()
    finally:
        if owned:
            scheduler.stop_all()
    rl_summary_path = paths.rl_summary
    if not rl_summary_path.is_file():
        raise EngineError(f"the RL workers exited cleanly but wrote no {rl_summary_path}")
    summary = {
        **json.loads(rl_summary_path.read_text(encoding="utf-8")),
        **sft_facts,
        "run_dir": str(run_dir),
        "start_model_dir": model_dir,
        "dataset": cfg.dataset.path,
        "algorithm": cfg.algorithm.name,
        "max_head_offpolicyness": cfg.rollout.max_head_offpolicyness,
        "wall_seconds": time.perf_counter() - started,
        "scheduler": cfg.cluster.scheduler,
        "placement": plan_placement(cfg.allocation, cfg.cluster).to_dict(node_names),
    }
    paths.summary.write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
    return summary


def _watch(scheduler: Scheduler, fleet: Any, servers_file: Path) -> None:
    """Until the workers exit: relay rank 0's progress; raise on a failed worker or a lost server.

    After a restart the fleet's addresses go to ``servers_file``: rank 0's client adopts them at
    its next weight update, which gives the restarted server the current weights."""
    from areal_tasks.rollout.servers import write_server_list
    from areal_tasks.trainer.progress_relay import wait_with_progress

    def check_servers() -> None:
        restarted = fleet.check()
        if restarted:
            write_server_list(servers_file, fleet.addresses)
            logger.warning(
                "inference servers %s restarted at %s: the client adopts them at the next weight update",
                restarted,
                fleet.addresses,
            )

    wait_with_progress(scheduler, RL_GROUP, poll_s=POLL_S, on_poll=check_servers)


def format_summary(summary: dict[str, Any]) -> str:
    """A few lines for the console."""
    lines = [
        f"{'':<16} {'before RL':>10} {'after RL':>10}",
        f"{'eval reward':<16} {summary['reward_before']:>10.3f} {summary['reward_after']:>10.3f}",
        f"{'eval accuracy':<16} {summary['accuracy_before']:>10.3f} {summary['accuracy_after']:>10.3f}",
        f"{'greedy accuracy':<16} {summary['greedy_accuracy_before']:>10.3f} {summary['greedy_accuracy_after']:>10.3f}",
        f"(eval: temperature {summary['eval_temperature']}, {summary['eval_samples_per_prompt']} sample(s) per prompt)",
        f"{summary['algorithm']}: {summary['steps']} RL steps (eta={summary['max_head_offpolicyness']}) on "
        f"{summary['eval_prompts']} eval prompts of {summary['dataset']}",
    ]
    if "sft_steps" in summary:
        lines.append(
            f"SFT warm start: {summary['sft_steps']} steps, loss {summary['sft_loss_first']:.3f} -> "
            f"{summary['sft_loss_last']:.3f}, {summary['sft_wall_s']:.1f} s"
        )
    lines.append(f"total: {summary['wall_seconds']:.1f} s; run dir {summary['run_dir']}")
    return "\n".join(lines)
