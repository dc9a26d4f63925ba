"""Weight operations of the embedded server are bounded and never leave it paused or gated.

On the tiny model's real engine, with a fake rendezvous that blocks until released (as one with a
peer that accepts but never answers does): the set-up past its deadline answers 504, a second one
409 at once, a disk update still runs (its own lane), generation goes on, and ``stuck_reason``
names the stuck call until it returns. An update on a busy server that cannot drain in time fails
with 503 and lets new requests in again. ``/areal/swap_weights`` with a bad directory fails and
resumes: the old weights and version keep serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest
from server_helpers import generate, make_request

import areal_tasks.inference.server.weight_service as weight_service
from areal_tasks.inference.server.protocol import SwapWeightsReqInput
from areal_tasks.inference.server.server import WeightBounds
from areal_tasks.inference.server.weight_guard import WeightOperationError
from areal_tasks.inference.server.weight_service import WeightService
from areal_tasks.models.safetensors_dir import INDEX_FILE

PROMPT = [5, 6, 7, 8]


@pytest.fixture(autouse=True)
def short_grace(monkeypatch) -> None:
    monkeypatch.setattr(weight_service, "GRACE_S", 0.05)


def service(engine, **bounds: float) -> WeightService:
    return WeightService(engine, WeightBounds(**{"group_timeout_s": 0.2, "drain_timeout_s": 0.3, **bounds}))


def init(svc: WeightService, name: str) -> asyncio.Future:
    return svc.init_group("127.0.0.1", 1, 1, 2, name, "gloo")


def test_a_hung_rendezvous_is_cut_short_refuses_the_next_and_is_reported(engine, tiny_qwen2: Path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def blocking_join(*args: object) -> None:
        entered.set()
        release.wait(60)

    async def scenario() -> None:
        svc = service(engine)
        svc.collective.join = blocking_join
        started = time.monotonic()
        with pytest.raises(WeightOperationError, match=r"did not finish within 0.25 s") as timed_out:
            await init(svc, "g1")
        assert timed_out.value.status == 504 and entered.is_set()
        with pytest.raises(WeightOperationError, match="another weight operation is still running") as busy:
            await init(svc, "g2")
        assert busy.value.status == 409 and time.monotonic() - started < 30
        reason = svc.stuck_reason()
        assert reason is not None and "init_weights_update_group(g1 at 127.0.0.1:1)" in reason
        # the weights lane is free: a disk update runs, and generation goes on
        version = engine.weight_version
        assert await svc.update_from_disk(str(tiny_qwen2), None, False, None, True) == (
            True,
            "Succeeded to update model weights.",
        )
        assert engine.weight_version == str(int(version) + 1)
        assert generate(engine, PROMPT, max_new_tokens=3, ignore_eos=True).finish_reason["type"] == "length"
        release.set()
        deadline = time.monotonic() + 30
        while svc.stuck_reason() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert svc.stuck_reason() is None
        svc.close()
        with pytest.raises(WeightOperationError, match="shutting down") as closing:
            await init(svc, "g3")
        assert closing.value.status == 503

    try:
        asyncio.run(scenario())
    finally:
        release.set()


def test_an_update_that_cannot_drain_in_time_fails_and_reopens_the_gate(
    engine, tiny_qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = make_request(PROMPT, rid="long", temperature=0.0, max_new_tokens=100_000, ignore_eos=True)
    engine.submit(long.seqs)
    while not long.seqs[0].output_ids:
        time.sleep(0.001)
    version = engine.weight_version
    # the sequence reaches the context length (512) in a few hundred steps; on a loaded machine the
    # update's read can outlast it, so the drain sees it in flight however long the read takes
    in_flight = engine.in_flight
    monkeypatch.setattr(engine, "in_flight", lambda: max(in_flight(), 1))

    async def scenario() -> None:
        svc = service(engine)
        with pytest.raises(WeightOperationError, match=r"server busy: 1 sequences still in flight after 0.3 s") as busy:
            await svc.update_from_disk(str(tiny_qwen2), None, False, None, True)
        assert busy.value.status == 503
        assert svc.stuck_reason() is None

    try:
        asyncio.run(scenario())
        monkeypatch.setattr(engine, "in_flight", in_flight)
        assert engine.weight_version == version and not engine.stats().draining
        assert generate(engine, PROMPT, max_new_tokens=2, ignore_eos=True).finish_reason["type"] == "length"
    finally:
        engine.call(lambda: engine.abort_rid("long")).result(timeout=30)
    long.wait()


def _bad_dirs(root: Path, model: Path) -> dict[str, Path]:
    garbage, no_map, escape = root / "garbage", root / "no-map", root / "escape"
    for path in (garbage, no_map, escape):
        path.mkdir()
    (garbage / "model.safetensors").write_bytes(os.urandom(4096))
    (no_map / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    (escape / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "../../model.safetensors"}}))
    return {"garbage": garbage, "no weight_map": no_map, "escaping index": escape, "outside the roots": model}


@pytest.mark.parametrize("case", ["garbage", "no weight_map", "escaping index", "outside the roots"])
def test_a_failed_swap_resumes_on_the_old_weights(engine, tiny_qwen2: Path, tmp_path: Path, case: str) -> None:
    roots = (str(tmp_path / "roots"),)
    (tmp_path / "roots").mkdir()
    bad = _bad_dirs(tmp_path / "roots", tmp_path / "elsewhere")[case]
    version = engine.weight_version

    async def scenario() -> tuple[bool, str, dict[str, float]]:
        return await service(engine, roots=roots).swap(SwapWeightsReqInput(model_path=str(bad), weight_version="99"))

    success, message, timings = asyncio.run(scenario())
    assert not success and message.startswith("Failed to update weights: ")
    assert engine.paused is None and engine.weight_version == version
    assert set(timings) == {"pause_s", "transfer_s", "resume_s"}
    assert generate(engine, PROMPT, max_new_tokens=2, ignore_eos=True).finish_reason["type"] == "length"


def test_an_operation_holding_generation_past_its_deadline_is_stuck(engine) -> None:
    async def scenario() -> None:
        svc = service(engine)
        assert svc.stuck_reason() is None
        async with svc.guard.holding_generation("/areal/swap_weights", 0.0):
            await asyncio.sleep(0.01)
            assert "a weight update holds generation: /areal/swap_weights" in (svc.stuck_reason() or "")
        assert svc.stuck_reason() is None

    asyncio.run(scenario())
