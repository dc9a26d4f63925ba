"""Step 3 of the RL loop: the actor's new weights to the inference servers, as ``rollout.weight_update`` says.

``disk`` writes sharded safetensors (rank 0) *before* pausing, then rank 0 pauses the servers,
loads, bumps the version and resumes: the servers stop only for the load. ``collective`` pauses,
broadcasts the buckets from rank 0 while the client has every server receive them, and resumes.
``shared`` packs the weights into the trainer's shared buffers *before* pausing; paused, each server
copies them from the buffer on its device. With ``rollout.pause_mode=abort`` (the default)
in-flight requests are aborted by the pause and resubmitted with their partial output (partial
rollout); ``in_place`` keeps them, with their KV cache, on the servers.

:meth:`WeightPublisher.close` tears the collective group down before the engines are destroyed:
the servers leave it (``/destroy_weights_update_group``) while rank 0 destroys its side, both
bounded, so neither waits forever for a peer that never leaves.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.trainer.collectives import barrier, broadcast_int, rank

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.engine.fsdp.engine import FSDPEngine
    from areal_tasks.rollout.process import RolloutProcess
    from areal_tasks.rollout.side import RolloutSide

logger = logging.getLogger(__name__)

#: weight-update directories kept on disk (the newest ones).
KEEP_WEIGHT_DIRS = 2


class WeightPublisher:
    """Step 3 of the loop: new weights from the actor to the servers, as ``rollout.weight_update`` says."""

    def __init__(
        self, cfg: JobConfig, actor: FSDPEngine, side: RolloutSide | RolloutProcess | None, run_dir: Path
    ) -> None:
        self.cfg, self.actor, self.side = cfg, actor, side
        self.root = RunPaths.of(run_dir).weights
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
            barrier()
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
            barrier()
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
            self._collective_port = broadcast_int(PortAllocator().allocate(1)[0] if rank() == 0 else 0)
        n_servers = self.side.n_servers if self.side is not None else 0
        n_servers = broadcast_int(n_servers)
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
