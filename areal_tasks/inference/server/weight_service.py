"""Weight updates as the HTTP routes see them: SGLang's semantics on top of ``areal_tasks.weights`` and the engine.

* **Writer lock.** An update on a server that is not paused first holds new requests back and
  waits for the requests in flight to finish (SGLang's ``model_update_lock``); on a paused server
  it runs at once. The staged tensors are copied into the model between two decode steps. The
  new weights are staged (read, received) *before* new requests are held back, so the hold lasts
  only the drain and the copy; the drain has a deadline (``drain_timeout_s``), after which new
  requests go in again and the update fails with 503 (pause first, as the client's swap does).
* **Bounds.** Staging, receiving, joining and leaving groups run on lanes of their own with
  deadlines (:class:`~areal_tasks.inference.server.server.WeightBounds`) through
  :mod:`~areal_tasks.inference.server.weight_guard`: 504 past a deadline, 409 while a lane's
  thread is taken, :meth:`WeightService.stuck_reason` for ``/health``. A rendezvous with a peer
  that accepts the connection but never answers is such a call (torch's store client has no
  deadline for its handshake).
* **Errors.** Every loader error (a bad or unreadable directory, a path outside the weight roots,
  a buffer that is not the trainer's, a tensor that does not fit the model) is a
  :class:`~areal_tasks.errors.WeightTransportError` raised while staging, before the model
  changes, and answers 400 with the old weights and version still served.
* **Cache flush.** With ``flush_cache`` (the default) an update fails after loading the weights
  when sequences still hold KV computed before it (running or retracted ones after an
  ``in_place``/``retract`` pause), exactly as SGLang's ``flush_cache_after_weight_update`` does.
  Every update also calls ``Engine.weights_changed``, which drops every prefix-cache entry: KV
  computed with older weights is never reused.
* **Sessions.** ``/update_weights_from_distributed`` runs only inside
  ``/begin_weight_update`` ... ``/end_weight_update`` (SGLang 0.5.23 refuses it otherwise).
  ``/end_weight_update`` fails when the buckets left a MoE layer's per-expert tensors incomplete
  (:meth:`~areal_tasks.weights.base.WeightReceiver.finish_update`), naming the missing experts;
  the buckets applied before stay loaded (a collective update is applied bucket by bucket) and
  the version is not bumped.
* **Receivers.** What each kind of load reads and checks is the transport's receiving side
  (``areal_tasks.weights``): :class:`~areal_tasks.weights.disk.DiskReceiver` (a safetensors
  directory), :class:`~areal_tasks.weights.collective.CollectiveReceiver` (the groups this server
  joined, and the buckets received over them), :class:`~areal_tasks.weights.shared.SharedReceiver`
  (the trainer's buffer on this server's device, opened once). Each stages the complete new
  tensors, checked against the served model; this module applies them between two decode steps.
* **Shared.** ``/areal/update_weights_from_shared`` waits for the copy out of the buffer before
  answering, so the trainer may pack the next update at once.
* **Swap.** ``/areal/swap_weights`` pauses, loads and resumes, and resumes whether or not the
  load succeeded: a failed load leaves the old weights and version, served again.
* **Groups.** ``/destroy_weights_update_group`` leaves a group; the client sends it while the
  trainer destroys its side. The destroy is bounded (then the group is aborted locally), so a
  trainer that is already gone cannot hang the server.
* **Versions.** SGLang's ``weight_version`` string is the policy version. An update that names a
  ``weight_version`` sets it; a disk update without one bumps it (``int + 1`` while it is an
  integer, else the number of updates so far); a collective session without one bumps it once,
  at ``/end_weight_update``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from areal_tasks.errors import InferenceError, WeightTransportError
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.executors import Lanes
from areal_tasks.inference.server.protocol import SwapWeightsReqInput
from areal_tasks.inference.server.server import WeightBounds
from areal_tasks.inference.server.weight_guard import APPLY_ALLOWANCE_S, GRACE_S, WeightGuard, WeightOperationError
from areal_tasks.trace import flush as flush_trace
from areal_tasks.trace import set_step, span
from areal_tasks.weights.base import ServedWeights, WeightLoad
from areal_tasks.weights.collective import CollectiveReceiver
from areal_tasks.weights.disk import DiskReceiver
from areal_tasks.weights.group import GROUP_ABORT_TIMEOUT_S, GROUP_DESTROY_TIMEOUT_S
from areal_tasks.weights.roots import WeightRoots
from areal_tasks.weights.shared import SharedReceiver

logger = logging.getLogger(__name__)

__all__ = ["WeightService"]

T = TypeVar("T")

_FLUSH_FAILED = (
    "Weights were updated, but the cache was not flushed because requests are still running or "
    "queued. Retract or finish them, then call /flush_cache."
)


@dataclass
class _Session:
    """An open ``begin_weight_update`` ... ``end_weight_update`` session."""

    loaded: bool = False
    versioned: bool = False


class WeightService:
    """Disk, collective and shared-memory weight updates of one engine (see the module doc).

    ``bounds``: weight roots (besides the served model's directory) and time limits; ``lanes``:
    the server's lanes when it shares them (else the service makes its own ``weights`` and
    ``groups`` lanes, and shuts them down in :meth:`close`).
    """

    def __init__(self, engine: Engine, bounds: WeightBounds | None = None, lanes: Lanes | None = None) -> None:
        self.engine = engine
        self.runner = engine.runner
        self.bounds = bounds or WeightBounds()
        self.roots = WeightRoots.of([self.runner.cfg.model_path, *self.bounds.roots])
        self.disk = DiskReceiver(self.runner.device, self.roots)
        self.collective = CollectiveReceiver(self.runner.device)
        self.shared = SharedReceiver(self.runner.device)
        self.session: _Session | None = None
        self.updates = 0
        self._lock = asyncio.Lock()
        self.guard = WeightGuard(engine, self.bounds.drain_timeout_s, lanes)

    @property
    def groups(self) -> list[str]:
        """Names of the weight-update groups this server joined."""
        return sorted(self.collective.groups)

    def served(self) -> ServedWeights:
        """The served model, as the receivers check an update against it."""
        return ServedWeights(self.runner.weight_specs(), self.runner.required_weight_names())

    def _next_version(self) -> str:
        current = self.engine.weight_version
        return str(int(current) + 1) if current.lstrip("-").isdigit() else str(self.updates)

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.engine.call(fn))

    def stuck_reason(self) -> str | None:
        """Why a weight operation keeps this server from serving, or None (``/health`` answers 503
        with it; :meth:`WeightGuard.stuck_reason`)."""
        return self.guard.stuck_reason()

    async def abort_all(self, reason: str) -> None:
        await self._call(lambda: self.engine.abort_all(reason))

    async def _locked_update(
        self, stage: Callable[[], Awaitable[dict[str, torch.Tensor]]], version: str | None, *, wait: bool = False
    ) -> bool:
        """Stage, then apply between two steps, under SGLang's writer-lock rules. Returns whether
        sequences still hold KV from before the update (a requested cache flush then fails).
        ``wait``: the apply waits for its copies (staged tensors the trainer will overwrite).
        Logs how long the staging (read or receive) and the apply between two steps took."""
        staged_from = time.perf_counter()
        named = await stage()
        applied_from = time.perf_counter()

        def apply() -> bool:
            self.runner.load_weights(named.items())
            if wait and self.runner.device.type == "cuda":
                torch.cuda.current_stream(self.runner.device).synchronize()
            self.engine.weights_changed(version)
            return self.engine.holds_kv()

        if self.engine.paused is not None:
            busy = await self._call(apply)
        else:
            bound = self.bounds.drain_timeout_s + APPLY_ALLOWANCE_S
            async with self.guard.holding_generation("the drain before a weight update", bound):
                self.engine.set_gate(True)
                try:
                    await self.guard.drain()
                    busy = await self._call(apply)
                finally:
                    self.engine.set_gate(False)
        logger.info(
            "weight update: %d tensors staged in %.1f ms, applied in %.1f ms",
            len(named),
            1e3 * (applied_from - staged_from),
            1e3 * (time.perf_counter() - applied_from),
        )
        self.updates += 1
        return bool(busy)

    async def update_from_disk(
        self, model_path: str, weight_version: str | None, abort_all: bool, load_format: str | None, flush_cache: bool
    ) -> tuple[bool, str]:
        if load_format not in (None, "auto", "safetensors"):
            return False, f"load_format {load_format!r} is not supported (use auto or safetensors)"

        async def stage() -> dict[str, torch.Tensor]:
            load = WeightLoad(path=model_path)
            return await self.guard.run(
                "weights",
                lambda: self.disk.receive(load, self.served()),
                timeout_s=self.bounds.load_timeout_s,
                what="update_weights_from_disk",
            )

        failed, busy, version = await self._versioned_update(
            stage,
            weight_version,
            abort_all,
            "update_weights_from_disk",
            (WeightTransportError, InferenceError, OSError, ValueError),
            detail=f"({model_path})",
        )
        if failed is not None:
            return False, f"Failed to update weights: {failed}"
        logger.info("loaded weights from %s as version %s", model_path, version)
        if flush_cache and busy:
            return False, _FLUSH_FAILED
        return True, "Succeeded to update model weights."

    async def _versioned_update(
        self,
        stage: Callable[[], Awaitable[dict[str, torch.Tensor]]],
        weight_version: str | None,
        abort_all: bool,
        route: str,
        errors: tuple[type[BaseException], ...],
        *,
        detail: str = "",
        wait: bool = False,
    ) -> tuple[BaseException | None, bool, str]:
        """A disk or shared update (``route``) under the update lock: abort running requests when
        asked, then stage and apply as ``weight_version`` (or the next version). Returns ``(the
        error among errors that failed it, logged, or None; whether sequences still hold KV from
        before it; the version)``. A bound's :class:`WeightOperationError` propagates."""
        async with self._lock:
            if abort_all:
                await self.abort_all(f"aborted by {route}")
            version = weight_version if weight_version is not None else self._next_version()
            try:
                busy = await self._locked_update(stage, version, wait=wait)
            except WeightOperationError:
                raise
            except errors as exc:
                logger.error("%s%s failed: %s", route, detail, exc)
                return exc, False, version
        return None, busy, version

    async def update_from_shared(
        self,
        descriptions: list[dict],
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        weight_version: str | None,
        abort_all: bool,
        flush_cache: bool,
    ) -> tuple[bool, str]:
        load = WeightLoad(shared_buffers=tuple(descriptions), names=names, dtypes=dtypes, shapes=shapes)

        async def stage() -> dict[str, torch.Tensor]:
            return await self.guard.run(
                "weights",
                lambda: self.shared.receive(load, self.served()),
                timeout_s=self.bounds.load_timeout_s,
                what="update_weights_from_shared",
            )

        failed, busy, version = await self._versioned_update(
            stage,
            weight_version,
            abort_all,
            "update_weights_from_shared",
            (WeightTransportError, InferenceError, RuntimeError, ValueError),
            wait=True,
        )
        if failed is not None:
            return False, f"Failed to update weights from shared memory: {failed}"
        if flush_cache and busy:
            return False, _FLUSH_FAILED
        return True, f"Succeeded to update model weights from shared memory. Weight version updated to {version}."

    async def init_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> tuple[bool, str]:
        """Join a group on the ``groups`` lane: the rendezvous is bounded by ``bounds.group_timeout_s``
        (the group's operations by ``bounds.load_timeout_s``); a second set-up while one is in
        flight is refused at once (409)."""
        if group_name in self.collective.groups:
            return False, f"Failed to initialize custom process group: group {group_name!r} exists."
        bounds = self.bounds
        try:
            await self.guard.run(
                "groups",
                self.collective.join,
                master_address,
                master_port,
                rank_offset,
                world_size,
                group_name,
                backend,
                bounds.load_timeout_s,
                bounds.group_timeout_s,
                timeout_s=bounds.group_timeout_s + GRACE_S,
                what=f"init_weights_update_group({group_name} at {master_address}:{master_port})",
            )
        except (WeightTransportError, RuntimeError, ValueError) as exc:
            logger.error("init_weights_update_group(%s) failed: %s", group_name, exc)
            return False, f"Failed to initialize custom process group: {exc}."
        return True, "Succeeded to initialize custom process group."

    async def destroy_group(self, group_name: str) -> tuple[bool, str]:
        if group_name not in self.collective.groups:
            return False, "The group to be destroyed does not exist."
        clean = await self.guard.run(
            "groups",
            self.collective.leave,
            group_name,
            timeout_s=GROUP_DESTROY_TIMEOUT_S + GROUP_ABORT_TIMEOUT_S + GRACE_S,
            what=f"destroy_weights_update_group({group_name})",
        )
        if not clean:  # the group is gone either way: aborted locally after the bound (logged)
            return True, "Destroyed custom process group (aborted: the destroy did not complete in time)."
        return True, "Succeeded to destroy custom process group."

    def close(self, timeout_s: float | None = None) -> None:
        """Server shutdown: refuse new weight operations, leave every group (each leave bounded by
        ``timeout_s``, default the group's destroy timeout, so a gone trainer cannot hang it) and
        drop the mapping of the trainer's shared buffer. A lane thread still running (a hung
        rendezvous) is not waited for."""
        self.guard.close()
        self.collective.close(timeout_s)
        self.shared.close()

    def begin(self) -> tuple[bool, str]:
        if self.session is not None:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session = _Session()
        return True, "Success"

    async def end(self) -> tuple[bool, str]:
        if self.session is None:
            return False, "no weight-update session is open; call begin_weight_update() first"
        session, self.session = self.session, None
        try:
            self.collective.finish_update()
        except WeightTransportError as exc:
            logger.error("end_weight_update: the update is incomplete, the buckets applied before stay loaded: %s", exc)
            return False, f"Failed to update weights: {exc}"
        if session.loaded and not session.versioned:
            async with self._lock:
                version = self._next_version()
                await self._call(lambda: self.engine.weights_changed(version))
        return True, "Success"

    async def update_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: str | None,
        abort_all: bool,
        load_format: str | None,
        flush_cache: bool,
    ) -> tuple[bool, str]:
        session = self.session
        if session is None:
            return (
                False,
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()",
            )
        if group_name not in self.collective.groups:
            return False, f"Failed to receive weights: group {group_name!r} is not initialized"
        load = WeightLoad(group_name=group_name, names=names, dtypes=dtypes, shapes=shapes, load_format=load_format)

        async def stage() -> dict[str, torch.Tensor]:
            return await self.guard.run(
                "weights",
                lambda: self.collective.receive(load, self.served()),
                timeout_s=self.bounds.load_timeout_s + GRACE_S,
                what=f"update_weights_from_distributed({group_name})",
            )

        async with self._lock:
            if abort_all:
                await self.abort_all("aborted by update_weights_from_distributed")
            try:
                busy = await self._locked_update(stage, weight_version)
            except WeightOperationError:
                raise
            except (WeightTransportError, InferenceError, RuntimeError, ValueError) as exc:
                logger.error("update_weights_from_distributed failed: %s", exc)
                return False, f"Failed to receive weights: {exc}"
            session.loaded = True
            session.versioned |= weight_version is not None
        if flush_cache and busy:
            return False, _FLUSH_FAILED
        message = "Succeeded to update parameter online."
        if weight_version is not None:
            message += f" Weight version updated to {weight_version}."
        return True, message

    async def swap(self, req: SwapWeightsReqInput) -> tuple[bool, str, dict[str, float]]:
        """``/areal/swap_weights``: pause in ``req.mode``, load (disk, shared buffers, or one
        collective bucket inside its own begin/end session), resume; ``(success, message, seconds of each part)``.

        What the client would otherwise send as five requests (pause, begin, update, end, resume),
        each a round trip inside the pause. The server resumes whatever the load did: a failed
        load (an error answer, or a bound's :class:`WeightOperationError`) leaves the old weights
        and version, and generation goes on with them.
        """
        started = time.perf_counter()
        bound = self.bounds.load_timeout_s + GRACE_S + APPLY_ALLOWANCE_S
        step = _step_of(req.weight_version)
        set_step(step, weak=True)  # the spans of this swap belong to the step that made these weights
        with span("swap weights", "server", version=req.weight_version, mode=req.mode):
            async with self.guard.holding_generation("/areal/swap_weights", bound):
                with span("pause", "server"):
                    await self._call(lambda: self.engine.pause(req.mode))
                paused = time.perf_counter()
                try:
                    with span("load weights", "server", disk=req.model_path is not None):
                        success, message = await self._swap_load(req)
                finally:
                    loaded = time.perf_counter()
                    with span("resume", "server"):
                        await self._call(self.engine.resume)
        flush_trace()  # a server is stopped by a signal: what it traced is on disk by then
        set_step(None if step is None else step + 1, weak=True)  # generation now serves the next step
        if not success:
            logger.warning("/areal/swap_weights failed, generation resumed on the old weights: %s", message)
        timings = {"pause_s": paused - started, "transfer_s": loaded - paused, "resume_s": time.perf_counter() - loaded}
        return success, message, timings

    async def _swap_load(self, req: SwapWeightsReqInput) -> tuple[bool, str]:
        """The load of a swap, on a paused server."""
        if req.model_path is not None:
            return await self.update_from_disk(req.model_path, req.weight_version, False, None, req.flush_cache)
        if req.shared_buffers:
            return await self.update_from_shared(
                req.shared_buffers, req.names, req.dtypes, req.shapes, req.weight_version, False, req.flush_cache
            )
        success, message = self.begin()
        if not success:
            return success, message
        try:
            loaded = await self.update_from_distributed(
                req.names,
                req.dtypes,
                req.shapes,
                req.group_name,
                req.weight_version,
                False,
                "flattened_bucket",
                req.flush_cache,
            )
        finally:
            ended = await self.end()  # close the session either way, so the next update can open one
        return ended if loaded[0] and not ended[0] else loaded

    async def set_version(self, new_version: str, abort_all: bool) -> None:
        if abort_all:
            await self.abort_all("aborted by update_weight_version")
        await self._call(lambda: self.engine.weights_changed(new_version))


def _step_of(weight_version: str | None) -> int | None:
    """The RL step that made the weights of ``weight_version`` (the policy version is the step), or None."""
    try:
        return int(weight_version) if weight_version is not None else None
    except ValueError:
        return None
