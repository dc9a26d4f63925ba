"""Fakes for the rollout executor tests: a timed InferenceEngine and a configurable workflow.

``TimedEngine`` answers every request after a seeded random delay (``delay(rng) -> seconds``), tags
the first half of the output with the version at submission and the second half with the version at
the end (so a request that spans a weight update has mixed versions), holds requests while paused
(partial rollout, as the real client does), and records pause/resume/update/close calls and the
peak number of requests in flight. ``FakeWorkflow`` runs one request per episode on integer dataset
items and can reject (return None), raise, or return an invalid trajectory by a predicate; it
records call order, the peak number of episodes running, and cancellations. ``GatedWorkflow`` holds
the episodes of chosen items after they generated, until the test calls ``release()``: a long-tail
group whose tokens carry its admission version, finishing exactly when the test says.
``FakeSide`` (built by :func:`build_fake_side`) is a rollout side over these fakes, for the
executor contract test to run in this process and in a rollout process.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse, PauseMode, SamplingParams
from areal_tasks.api.workflow import RolloutWorkflow, Trajectory

Delay = Callable[[random.Random], float]


def uniform_delay(low: float = 0.0005, high: float = 0.004) -> Delay:
    """Short uniform delays."""
    return lambda rng: rng.uniform(low, high)


def long_tail_delay(scale: float = 0.0008, alpha: float = 1.1, cap: float = 0.25) -> Delay:
    """Pareto delays: most requests are quick, a few take hundreds of times longer."""
    return lambda rng: min(cap, scale * rng.paretovariate(alpha))


class TimedEngine(InferenceEngine):
    """An InferenceEngine whose requests take ``delay(rng)`` seconds and carry per-token versions."""

    def __init__(self, delay: Delay | None = None, seed: int = 0, version: int = 0, n_tokens: int = 4) -> None:
        self.delay = delay or uniform_delay()
        self.rng = random.Random(seed)
        self.version = version
        self.n_tokens = n_tokens
        self.paused = False
        self._resumed: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.pause_calls: list[str] = []
        self.resume_calls = 0
        self.updates: list[int] = []
        self.aclose_calls = 0

    def _gate(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
            if not self.paused:
                self._resumed.set()
        return self._resumed

    async def _wait_if_paused(self) -> None:
        while self.paused:
            await self._gate().wait()

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._wait_if_paused()
            first = self.version
            await asyncio.sleep(self.delay(self.rng))
            await self._wait_if_paused()
            last = self.version
        finally:
            self.in_flight -= 1
        half = self.n_tokens // 2
        versions = [first] * half + [last] * (self.n_tokens - half)
        return ModelResponse(
            rid=req.rid,
            input_ids=list(req.input_ids),
            output_ids=[7] * self.n_tokens,
            output_logprobs=[-0.5] * self.n_tokens,
            output_versions=versions,
            stop_reason="stop",
            ttft_s=0.0,
            latency_s=0.0,
        )

    async def pause(self, mode: PauseMode = "abort") -> None:
        self.pause_calls.append(mode)
        self.paused = True
        self._gate().clear()

    async def resume(self) -> None:
        self.resume_calls += 1
        self.paused = False
        self._gate().set()

    async def update_weights(self, meta: Any, buckets: Sequence[Any] | None = None) -> None:
        self.updates.append(meta.version)
        self.version = meta.version

    def get_version(self) -> int:
        return self.version

    def set_version(self, version: int) -> None:
        self.version = version

    async def aclose(self) -> None:
        self.aclose_calls += 1
        self._resumed = None  # the event belongs to the loop that is going away


class FakeWorkflow(RolloutWorkflow):
    """One request per episode on an int item; predicates on ``(item, call_index)`` pick misbehaviour."""

    def __init__(
        self,
        *,
        reject: Callable[[int, int], bool] | None = None,
        fail: Callable[[int, int], bool] | None = None,
        invalid: Callable[[int, int], bool] | None = None,
        block: bool = False,
    ) -> None:
        self.reject, self.fail, self.invalid = reject, fail, invalid
        #: when set, episodes wait forever (until cancelled) before generating.
        self.block = block
        self.calls: list[int] = []
        self.running = 0
        self.max_running = 0
        self.cancelled = 0

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        n = len(self.calls)
        self.calls.append(data)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.block:
                await asyncio.Event().wait()
            start_version = engine.get_version()
            prompt = [1, 2 + int(data)]
            resp = await engine.agenerate(ModelRequest(input_ids=prompt, sampling=SamplingParams(max_new_tokens=4)))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        if self.fail is not None and self.fail(data, n):
            raise ValueError(f"boom on item {data}")
        if self.reject is not None and self.reject(data, n):
            return None
        k = resp.output_len
        traj = Trajectory(
            input_ids=prompt + resp.output_ids,
            loss_mask=[0] * len(prompt) + [1] * k,
            logprobs=[0.0] * len(prompt) + resp.output_logprobs,
            versions=[-1] * len(prompt) + resp.output_versions,
            reward=float(int(data) % 2),
            prompt_len=len(prompt),
            metadata={"item": data, "start_version": start_version},
        )
        if self.invalid is not None and self.invalid(data, n):
            traj.loss_mask = traj.loss_mask[:-1]  # lengths no longer line up: validate() raises
        return traj


class GatedWorkflow(FakeWorkflow):
    """A FakeWorkflow whose episodes of items with ``hold(item)`` finish only after :meth:`release`.

    A held episode generates first (its tokens carry the version of its start) and then waits, so a
    held group is a slow group admitted on time. ``held`` counts the episodes waiting now.
    """

    def __init__(self, hold: Callable[[int], bool], **kw: Any) -> None:
        super().__init__(**kw)
        self.hold = hold
        self.held = 0
        self._released = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Event | None = None

    def release(self) -> None:
        """Let the held episodes (and every later one) finish; any thread."""
        self._released.set()
        loop, gate = self._loop, self._gate
        if loop is not None and gate is not None:
            loop.call_soon_threadsafe(gate.set)

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        traj = await super().arun_episode(engine, data)
        if self.hold(data) and not self._released.is_set():
            if self._gate is None:
                self._loop, self._gate = asyncio.get_running_loop(), asyncio.Event()
            if not self._released.is_set():  # release() may have run before the gate existed
                self.held += 1
                try:
                    await self._gate.wait()
                finally:
                    self.held -= 1
        return traj


class FakeSide:
    """A rollout side whose executor runs over the fakes (what ``RolloutProcess`` serves)."""

    n_servers = 1

    def __init__(self, settings: dict[str, Any]) -> None:
        from areal_tasks.rollout.executor import RolloutExecutor

        self.executor = RolloutExecutor(engine=TimedEngine(seed=1), workflow=FakeWorkflow(), **settings)

    def evaluate(self, n_prompts: int | None = None, *, greedy: bool = False) -> dict[str, float]:
        return {"eval/reward": 0.0, "eval/n": float(n_prompts or 0)}

    def close(self) -> None:
        self.executor.stop()


def build_fake_side(settings: dict[str, Any]) -> FakeSide:
    """A :class:`FakeSide` with executor ``settings`` (module level: a spawned child can import it)."""
    return FakeSide(settings)


class HeapReportingSide(FakeSide):
    """A :class:`FakeSide` whose ``evaluate`` reports its process's frozen heap (``gc_heap.py``)."""

    def evaluate(self, n_prompts: int | None = None, *, greedy: bool = False) -> dict[str, float]:
        import gc

        return {"gc/frozen_objects": float(gc.get_freeze_count()), "gc/tracked_objects": float(len(gc.get_objects()))}


def build_heap_reporting_side(settings: dict[str, Any]) -> HeapReportingSide:
    """A :class:`HeapReportingSide` (module level: a spawned child can import it)."""
    return HeapReportingSide(settings)
