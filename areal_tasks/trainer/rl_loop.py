"""The RL loop of one train rank (SPMD: every rank runs this; rank 0 also owns the rollout side).

Per step ``k`` (policy version ``k - 1`` before it, ``k`` after it):

1. rank 0 takes a batch from the :class:`~areal_tasks.rollout.executor.RolloutExecutor` (which
   kept generating while the previous step trained, up to ``rollout.max_head_offpolicyness``
   versions ahead) and broadcasts it; a rollout failure is broadcast too, so every rank stops;
2. every rank packs it and runs :class:`~areal_tasks.trainer.rl_step.RLStep` (ref/critic/prox
   forwards, advantages, PPO mini-batches, critic);
3. the weight update: ``rollout.weight_update=disk`` writes sharded safetensors (rank 0) *before*
   pausing, then rank 0 pauses the servers, loads, bumps the version and resumes: the servers stop
   only for the load. ``collective`` pauses, broadcasts the buckets from rank 0 while the client
   has every server receive them, and resumes. ``shared`` packs the weights into the trainer's
   shared buffers *before* pausing; paused, each server copies them from the buffer on its device.
   With ``rollout.pause_mode=abort`` (the default) in-flight requests are aborted by the pause and
   resubmitted with their partial output (partial rollout); ``in_place`` keeps them, with their KV
   cache, on the servers;
4. evaluation every ``evaluation.freq_steps``, a checkpoint every ``saver.freq_steps`` (engines +
   the executor's position and counters), metrics to the callbacks (rank 0).

At the end (and on a failure) :meth:`WeightPublisher.close` tears the collective group down before
the engines are destroyed: the servers leave it (``/destroy_weights_update_group``) while rank 0
destroys its side, both bounded, so neither waits forever for a peer that never leaves.

Before the first step it recovers from the latest checkpoint (``recover.mode``) and, when it did,
pushes the recovered weights to the servers. It evaluates the starting policy (``reward_before``)
and the final one (``reward_after``) and writes ``<run_dir>/rl_summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.trainer.evaluate import samples_per_prompt

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.engine.fsdp.engine import FSDPEngine
    from areal_tasks.trainer.rl_rollout import RolloutSide
    from areal_tasks.trainer.rollout_process import RolloutProcess

logger = logging.getLogger(__name__)

#: file rank 0 writes at the end (the controller merges it into summary.json).
RL_SUMMARY = "rl_summary.json"
#: per-step metrics of rank 0.
RL_METRICS = "rl_metrics.jsonl"
#: weight-update directories kept on disk (the newest ones).
KEEP_WEIGHT_DIRS = 2


@dataclass
class _Failure:
    """A rollout failure on rank 0, broadcast in place of a batch so every rank stops."""

    message: str


def rl_steps(cfg: JobConfig) -> int:
    """RL steps of the run: ``train.total_steps`` minus the SFT warm-start steps."""
    n = cfg.train.total_steps - cfg.train.sft_warmup_steps
    if n < 1:
        raise ConfigError(
            f"train.total_steps={cfg.train.total_steps} leaves no RL step after "
            f"train.sft_warmup_steps={cfg.train.sft_warmup_steps}; raise total_steps"
        )
    return n


def logprob_temperature(cfg: JobConfig) -> float:
    """The temperature the trainer computes log-probs at: the sampling one (1.0 for greedy)."""
    t = cfg.rollout.sampling.temperature
    return t if t > 0 else 1.0


def build_engines(cfg: JobConfig, model_dir: str, n_steps: int) -> dict[str, FSDPEngine]:
    """The actor, and the reference and critic engines when the algorithm needs them (initialised)."""
    from areal_tasks.algo import build_algorithm
    from areal_tasks.engine.fsdp.engine import FSDPEngine

    algorithm = build_algorithm(cfg.algorithm)
    temperature, seed = logprob_temperature(cfg), cfg.experiment.seed
    engines = {
        "actor": FSDPEngine(
            cfg.actor,
            model_dir,
            total_steps=n_steps,
            temperature=temperature,
            seed=seed,
            shared_weight_buffer=cfg.rollout.weight_update == "shared",
        )
    }
    if algorithm.needs_ref:
        ref_cfg = cfg.ref or cfg.actor
        engines["ref"] = FSDPEngine(
            ref_cfg, model_dir, total_steps=n_steps, trainable=False, temperature=temperature, seed=seed
        )
    if algorithm.needs_critic:
        if cfg.critic is None:
            raise ConfigError(f"algorithm {cfg.algorithm.name!r} needs a critic: add a `critic:` engine section")
        critic_cfg = replace(cfg.critic, value_head=True)
        engines["critic"] = FSDPEngine(critic_cfg, model_dir, total_steps=n_steps, seed=seed)
    for engine in engines.values():
        engine.initialize()
    return engines


class WeightPublisher:
    """Step 3 of the loop: new weights from the actor to the servers, as ``rollout.weight_update`` says."""

    def __init__(
        self, cfg: JobConfig, actor: FSDPEngine, side: RolloutSide | RolloutProcess | None, run_dir: Path
    ) -> None:
        self.cfg, self.actor, self.side = cfg, actor, side
        self.root = run_dir / "weights"
        self._collective_port: int | None = None
        self._closed = False

    def publish(self, version: int) -> dict[str, float]:
        """Push the actor's weights as ``version``; returns timings (rank 0 has the server side).

        ``perf/weight_update_s`` is the whole update; ``perf/servers_paused_s`` the part this rank
        waits for the servers' swap: ``perf/weight_queue_s`` (the swap waiting for a loop on the
        rollout side to send it: its own control loop, or before the executor starts the
        episodes' loop; the servers still generate), then
        the servers' pause proper, made of ``perf/weight_pause_s`` (the pause: in-flight requests
        aborted or held), ``perf/weight_transfer_s`` (write or broadcast, and the servers' load)
        and ``perf/weight_resume_s``. For disk updates the write happens before the pause, and the
        removal of old weight directories after the resume: both count in the whole only. A
        collective update gathers and packs the weights before the pause where they fit in one
        bucket (``perf/weight_pack_s``; see ``TrainEngine.prepare_weight_update``).
        """
        import torch.distributed as dist

        started = time.perf_counter()
        parts: dict[str, float] = {}
        if self.cfg.rollout.weight_update == "disk":
            meta = WeightUpdateMeta.disk(str(self.root / f"v{version}"), version)
            self.actor.update_weights(meta)
            _barrier()
            paused_at = time.perf_counter()
            if self.side is not None:
                parts = self._swap_on_paused_servers(version, meta)
        elif self.cfg.rollout.weight_update == "shared":
            meta = WeightUpdateMeta.shared(version)
            parts["perf/weight_pack_s"] = self.actor.prepare_weight_update(meta)  # servers still generate
            self.actor.update_weights(meta)  # packed already: only the ranks' barrier
            paused_at = time.perf_counter()
            if self.side is not None:
                parts.update(
                    self._swap_on_paused_servers(version, meta.with_buffers(self.actor.shared_weight_buffers()))
                )
        else:
            meta = self._collective_meta(version)
            parts["perf/weight_pack_s"] = self.actor.prepare_weight_update(meta)  # servers still generate
            paused_at = time.perf_counter()
            if self.side is not None:  # the servers receive while this rank sends
                parts.update(self._swap_on_paused_servers(version, meta, lambda: self.actor.update_weights(meta)))
            else:
                self.actor.update_weights(meta)
        paused_s = time.perf_counter() - paused_at
        if self.side is not None and self.cfg.rollout.weight_update == "disk":
            self._prune(version)
        if dist.is_initialized():
            _barrier()
        self.actor.set_version(version)
        return {"perf/weight_update_s": time.perf_counter() - started, "perf/servers_paused_s": paused_s, **parts}

    def _swap_on_paused_servers(self, version: int, meta: WeightUpdateMeta, send: Any = None) -> dict[str, float]:
        """Rank 0: pause the servers, load ``meta``, set ``version``, resume (one executor call,
        ``swap_weights``); returns the three parts' times. ``send``, when given, runs here meanwhile
        (a collective update's broadcast: the servers receive once paused)."""
        ex = self.side.executor
        buckets = self._buckets(meta) if meta.type != "disk" else None
        mode = self.cfg.rollout.pause_mode
        if send is None:
            parts = ex.swap_weights(meta, buckets, version, mode)
        else:
            result: dict[str, dict[str, float]] = {}
            swap = _Background(lambda: result.update(parts=ex.swap_weights(meta, buckets, version, mode)))
            send()
            swap.join()
            parts = result["parts"]
        return {f"perf/weight_{part}_s": seconds for part, seconds in parts.items()}

    def close(self) -> None:
        """Tear the collective weight-update group down (every rank calls it; idempotent; never raises).

        Rank 0 runs the servers' leave (``side.executor.destroy_weight_groups()``, in a helper
        thread) concurrently with its own destroy of the group (``close_weight_groups``): as with
        the join, both sides must enter the teardown together, or with NCCL the first one waits
        for the other. Both are bounded: a server that cannot be reached is logged, and a local
        destroy that does not return in time is aborted (``engine/weights/collective.py``). Call
        it before ``engine.destroy()``. Nothing to do for disk updates or before the first join.
        """
        if self._closed:
            return
        self._closed = True
        if self._collective_port is None:
            return
        from areal_tasks.engine.fsdp.weight_sender import close_weight_groups

        leave = None
        if self.side is not None:
            leave = _Background(self.side.executor.destroy_weight_groups, name="weight-group-leave")
        try:
            close_weight_groups(self.actor)
        except Exception as exc:  # noqa: BLE001 - teardown goes on; the bounded destroy logs its own failures
            logger.warning("destroying the trainer's side of the weight-update group failed: %r", exc)
        if leave is not None:
            try:
                leave.join()
            except Exception as exc:  # noqa: BLE001 - a server that cannot be reached must not fail the run's end
                logger.warning("the inference servers did not all leave the weight-update group: %s", exc)

    def _collective_meta(self, version: int) -> WeightUpdateMeta:
        import torch

        from areal_tasks.launch.ports import PortAllocator

        if self._collective_port is None:  # one group for the whole run (the servers keep it)
            self._collective_port = _broadcast_int(PortAllocator().allocate(1)[0] if _rank() == 0 else 0)
        n_servers = self.side.n_servers if self.side is not None else 0
        n_servers = _broadcast_int(n_servers)
        return WeightUpdateMeta.collective(
            version,
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            self._collective_port,
            1 + n_servers,
            backend="nccl" if torch.cuda.is_available() else "gloo",
        )

    def _buckets(self, meta: WeightUpdateMeta) -> Any:
        """The collective update's bucket plan; a shared update's one "bucket": the buffers' layout."""
        from areal_tasks.api.inference import plan_weight_buckets
        from areal_tasks.engine.weights.shared import shared_layout

        if meta.type == "shared":
            return [shared_layout(self.actor.weight_specs())]
        return plan_weight_buckets(self.actor.weight_specs(), meta.bucket_bytes)

    def _prune(self, version: int) -> None:
        for old in range(version - KEEP_WEIGHT_DIRS, 0, -1):
            path = self.root / f"v{old}"
            if not path.exists():
                break
            shutil.rmtree(path, ignore_errors=False)


class _Background:
    """Run ``fn`` in a thread; :meth:`join` waits and re-raises its exception."""

    def __init__(self, fn: Any, name: str = "weight-receive") -> None:
        self._error: BaseException | None = None

        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in join()
                self._error = exc

        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _broadcast_int(value: int) -> int:
    return int(_broadcast_object(value))


def _broadcast_object(obj: Any) -> Any:
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run_rl_rank(
    cfg: JobConfig, model_dir: str, addresses: list[str], callbacks: list[Any] | None = None
) -> dict[str, Any]:
    """Run this rank's RL loop (see the module docstring); rank 0 returns the summary."""
    from areal_tasks.algo import build_algorithm
    from areal_tasks.checkpoint.layout import step_dir
    from areal_tasks.checkpoint.manager import CheckpointManager
    from areal_tasks.checkpoint.state import TrainerState
    from areal_tasks.trainer.rl_batch import pack_trajectories
    from areal_tasks.trainer.rl_rollout import RolloutSide
    from areal_tasks.trainer.rl_step import RLStep
    from areal_tasks.trainer.tracking import callbacks_from_config

    started = time.perf_counter()
    run_dir = Path(cfg.experiment.run_dir or ".")
    n_steps = rl_steps(cfg)
    engines = build_engines(cfg, model_dir, n_steps)
    actor = engines["actor"]
    is_main = actor.parallel.rank == 0
    manager = CheckpointManager.from_config(cfg)
    state = manager.recover(cfg.recover.mode, engines)
    version = state.version if state is not None else 0
    first_step = state.step + 1 if state is not None else 1
    side = RolloutSide.open(cfg, addresses, model_dir, version) if is_main else None
    publisher = WeightPublisher(cfg, actor, side, run_dir)
    step_runner = RLStep(
        actor,
        build_algorithm(cfg.algorithm),
        cfg.rollout.group_size,
        ref=engines.get("ref"),
        critic=engines.get("critic"),
        ppo_n_minibatches=cfg.actor.ppo_n_minibatches,
    )
    if callbacks is None:
        callbacks = callbacks_from_config(cfg, run_dir) if is_main else []
    summary: dict[str, Any] = {}
    try:
        if state is not None:
            logger.info("recovered step %d (version %d): pushing its weights to the servers", state.step, version)
            if side is not None and state.executor:
                side.executor.load_state_dict(state.executor)
            publisher.publish(version)
        before = {**side.evaluate(), **side.evaluate(greedy=True)} if side is not None else {}
        if side is not None:
            side.executor.start()
            logger.info(
                "starting policy: eval reward %.3f, accuracy %.3f", before["eval/reward"], before["eval/accuracy"]
            )
        for cb in callbacks:
            cb.on_start(n_steps - first_step + 1)
        last_metrics: dict[str, float] = {}
        for step in range(first_step, n_steps + 1):
            step_started = time.perf_counter()
            payload = _next_batch(side, cfg)
            if isinstance(payload, _Failure):
                raise RolloutError(f"rollout failed before step {step}: {payload.message}")
            waited = time.perf_counter() - step_started
            batch = pack_trajectories(payload, cfg.rollout.group_size, version)
            train_started = time.perf_counter()
            metrics = step_runner.run(batch)
            metrics["perf/train_s"] = time.perf_counter() - train_started
            metrics.update(publisher.publish(version + 1))
            version += 1
            metrics["perf/rollout_wait_s"] = waited
            metrics["perf/step_s"] = time.perf_counter() - step_started
            metrics["perf/tokens_per_s"] = metrics["n_tokens"] / max(metrics["perf/step_s"], 1e-9)
            metrics["version"] = float(version)
            if side is not None:
                metrics.update(
                    {
                        f"rollout/{k}": float(v)
                        for k, v in side.executor.last_batch_stats().items()
                        if isinstance(v, (int, float))
                    }
                )
            freq = cfg.evaluation.freq_steps
            if side is not None and freq and step % freq == 0 and step != n_steps:
                evaluated = side.evaluate()
                metrics.update(evaluated)
                _notify(callbacks, "on_eval", step, evaluated, None)
            # metrics first: a job killed after the save would resume past this step and never
            # log it (killed before the save, it redoes the step and logs it again)
            for cb in callbacks:
                cb.on_step(step, metrics)
            last_metrics = metrics
            if manager.should_save(step, last=step == n_steps):
                executor_state = side.executor.state_dict() if side is not None else {}
                ticket = manager.save(
                    step,
                    engines,
                    TrainerState(step=step, version=version, executor=executor_state),
                    {k: v for k, v in metrics.items() if k.startswith(("reward/", "eval/"))},
                    config=cfg,
                )
                if ticket.done():
                    url = manager.layout.url(step_dir(step))
                    _notify(callbacks, "on_checkpoint", step, url, ticket.wait().to_dict())
        if side is not None:
            side.executor.stop()  # nothing more is generated for training while the final policy is evaluated
            after = {**side.evaluate(), **side.evaluate(greedy=True)}
            _notify(callbacks, "on_eval", n_steps, after, None)
            summary = {
                "reward_before": before["eval/reward"],
                "reward_after": after["eval/reward"],
                "accuracy_before": before["eval/accuracy"],
                "accuracy_after": after["eval/accuracy"],
                "greedy_accuracy_before": before["eval_greedy/accuracy"],
                "greedy_accuracy_after": after["eval_greedy/accuracy"],
                "eval_temperature": cfg.evaluation.temperature,
                "eval_samples_per_prompt": samples_per_prompt(cfg),
                "eval_prompts": int(after["eval_greedy/n"]),
                "steps": n_steps,
                "first_step": first_step,
                "final_version": version,
                "wall_seconds": time.perf_counter() - started,
                "last_step": last_metrics,
                "executor": side.executor.stats(),
            }
            (run_dir / RL_SUMMARY).write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
            for cb in callbacks:
                cb.on_end(summary)
        manager.close()
    except BaseException as exc:
        _notify(callbacks, "fail", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        try:
            publisher.close()  # the servers leave the weight-update group while rank 0 destroys it
        finally:
            if side is not None:
                side.close()
            for engine in engines.values():
                engine.destroy()
    return summary


def _notify(callbacks: list[Any], hook: str, *args: Any) -> None:
    """Call an optional hook (``on_eval``, ``on_checkpoint``) on the callbacks that have it."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            method(*args)


def _next_batch(side: RolloutSide | RolloutProcess | None, cfg: JobConfig) -> Any:
    """Rank 0 takes a batch from the executor; every rank receives it (or the failure)."""
    payload: Any = None
    if side is not None:
        try:
            payload = side.executor.prepare_batch(timeout_s=max(600.0, 4 * cfg.rollout.request_timeout_s))
        except RolloutError as exc:
            payload = _Failure(str(exc))
    return _broadcast_object(payload)
