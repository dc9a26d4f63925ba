"""Step 3 of the RL loop: the actor's new weights to the inference servers, through one transport.

The transport is chosen once, from ``rollout.weight_update`` (``areal_tasks.weights.registry``),
and owns what the mode keeps between updates; this module runs the sequence every mode shares:
the work that needs no server first (the servers still generate), then rank 0 pauses the servers,
has them load, sets the version and resumes, in one executor call; a transport whose servers
receive while the trainer sends (``collective``: the broadcast) sends meanwhile. ``disk`` writes
sharded safetensors before the pause and prunes old directories after it; ``shared`` packs the
trainer's buffers before the pause; ``collective`` packs ahead where the weights fit one bucket.
With ``rollout.pause_mode=abort`` (the default) in-flight requests are aborted by the pause and
resubmitted with their partial output (partial rollout); ``in_place`` keeps them, with their KV
cache, on the servers.

:meth:`WeightPublisher.close` tears the transport down before the engines are destroyed: where
the servers joined a group, they leave it (``/destroy_weights_update_group``) while the trainer
ranks destroy their side, both bounded, so neither waits forever for a peer that never leaves.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.api.weights import WeightSource
from areal_tasks.trace import span
from areal_tasks.trainer.collectives import barrier
from areal_tasks.weights.base import PublishContext
from areal_tasks.weights.registry import build_transport

if TYPE_CHECKING:
    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.config.job import JobConfig
    from areal_tasks.rollout.process import RolloutProcess
    from areal_tasks.rollout.side import RolloutSide

logger = logging.getLogger(__name__)


class PublishedActor(WeightSource, Protocol):
    """The actor as the publisher uses it: a weight source whose policy version it sets."""

    def set_version(self, version: int) -> None:
        """Set the policy version of the current weights."""
        ...


class WeightPublisher:
    """Step 3 of the loop: new weights from the actor to the servers, through the configured transport."""

    def __init__(
        self, cfg: JobConfig, actor: PublishedActor, side: RolloutSide | RolloutProcess | None, run_dir: Path
    ) -> None:
        self.cfg, self.actor, self.side = cfg, actor, side
        context = PublishContext(
            weights_dir=RunPaths.of(run_dir).weights, n_servers=side.n_servers if side is not None else 0
        )
        self.transport = build_transport(cfg.rollout.weight_update, actor, context)
        self._pause_mode = cfg.rollout.pause_mode
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
        removal of old weight directories after the resume: both count in the whole only. Shared
        updates, and collective ones where the weights fit in one bucket, gather and pack before
        the pause (``perf/weight_pack_s``).
        """
        import torch.distributed as dist

        transport = self.transport
        started = time.perf_counter()
        meta = transport.plan(version)
        with span("weight gather/pack", "weights", transport=transport.name):
            parts = transport.prepare(meta)  # the servers still generate
        if not transport.sends_while_paused:
            with span("weight send", "weights", transport=transport.name):
                transport.send(meta)
        paused_at = time.perf_counter()
        if self.side is not None:
            server_meta, buckets = transport.server_update(meta)
            send = (lambda: _traced_send(transport, meta)) if transport.sends_while_paused else None
            with span("servers swap", "weights", version=version):
                parts.update(self._swap_on_paused_servers(version, server_meta, buckets, send))
        elif transport.sends_while_paused:
            _traced_send(transport, meta)
        paused_s = time.perf_counter() - paused_at
        if self.side is not None:
            transport.retire(meta)
        if dist.is_initialized():
            with span("weight barrier", "weights"):
                barrier()
        self.actor.set_version(version)
        return {"perf/weight_update_s": time.perf_counter() - started, "perf/servers_paused_s": paused_s, **parts}

    def _swap_on_paused_servers(
        self,
        version: int,
        meta: WeightUpdateMeta,
        buckets: list[list[ParamSpec]] | None,
        send: Any = None,
    ) -> dict[str, float]:
        """Rank 0: pause the servers, load ``meta``, set ``version``, resume (one executor call,
        ``swap_weights``); returns the three parts' times. ``send``, when given, runs here meanwhile
        (a collective update's broadcast: the servers receive once paused)."""
        ex = self.side.executor
        if send is None:
            parts = ex.swap_weights(meta, buckets, version, self._pause_mode)
        else:
            result: dict[str, dict[str, float]] = {}
            swap = _Background(lambda: result.update(parts=ex.swap_weights(meta, buckets, version, self._pause_mode)))
            send()
            swap.join()
            parts = result["parts"]
        return {f"perf/weight_{part}_s": seconds for part, seconds in parts.items()}

    def close(self) -> None:
        """Tear the transport down (every rank calls it; idempotent; never raises).

        Where the servers joined a group (``transport.servers_must_leave``), rank 0 runs their
        leave (``side.executor.destroy_weight_groups()``, in a helper thread) concurrently with the
        transport's own teardown: as with the join, both sides must enter it together, or with
        NCCL the first one waits for the other. Both are bounded: a server that cannot be reached
        is logged, and a local destroy that does not return in time is aborted
        (``areal_tasks/weights/group.py``). Call it before ``engine.destroy()``.
        """
        if self._closed:
            return
        self._closed = True
        leave = None
        if self.side is not None and self.transport.servers_must_leave:
            leave = _Background(self.side.executor.destroy_weight_groups, name="weight-group-leave")
        try:
            self.transport.close()
        except Exception as exc:  # noqa: BLE001 - teardown goes on; the bounded destroy logs its own failures
            logger.warning("closing the trainer's side of the %s weight transport failed: %r", self.transport.name, exc)
        if leave is not None:
            try:
                leave.join()
            except Exception as exc:  # noqa: BLE001 - a server that cannot be reached must not fail the run's end
                logger.warning("the inference servers did not all leave the weight-update group: %s", exc)


def _traced_send(transport: Any, meta: Any) -> None:
    """The transport's send (a collective broadcast while the servers are paused) as a span."""
    with span("weight send", "weights", transport=transport.name):
        transport.send(meta)


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
