"""The collective group's whole life between the trainer code and the embedded server, on gloo.

The client (``RemoteInferenceEngine``, embedded adapter) and this process as trainer rank 0
(``join_as_trainer`` + ``BucketedBroadcastSender``) run a weight update the way
``WeightPublisher.publish`` does; then both sides leave together (the client's
``destroy_weight_groups`` while the trainer's ``WeightGroup.destroy`` runs), and the server reports
no group. A new group of the same name joins, updates and leaves again. Finally the trainer leaves
first, alone, and the server still leaves promptly when told to (its destroy is bounded).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from embedded_server import ADMIN_KEY, free_port
from sglang_trainer import ordered_state

from areal_tasks.api.inference import plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.weights.buckets import spec_of
from areal_tasks.weights.collective import BucketedBroadcastSender
from areal_tasks.weights.group import WeightGroup, join_as_trainer

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

GROUP = "teardown_test_group"
BUCKET_BYTES = 64 * 1024


class _AdminTransport(httpx.AsyncHTTPTransport):
    """The session server guards its control endpoints with an admin key; the client sends none."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        return await super().handle_async_request(request)


class _Loop:
    """One event loop in a thread, so the client's calls run while this thread acts as the trainer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def client(server_url: str) -> Iterator[tuple[object, _Loop]]:
    from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter

    loop = _Loop()
    engine = RemoteInferenceEngine(
        [server_url], make_adapter("embedded"), ClientConfig(control_timeout_s=60.0), transport_factory=_AdminTransport
    )
    try:
        yield engine, loop
    finally:
        loop.submit(engine.aclose()).result(10)
        loop.close()


def _groups(http: httpx.Client) -> list[str]:
    return http.get("/server_info").json()["weight_update_groups"]


def _update(engine, loop: _Loop, meta: WeightUpdateMeta, group: WeightGroup | None, tensors) -> WeightGroup:
    """One collective update, both sides at once (as ``WeightPublisher.publish``); returns the trainer's group."""
    specs = [spec_of(n, t) for n, t in tensors]
    receiving = loop.submit(engine.update_weights(meta, plan_weight_buckets(specs, meta.bucket_bytes)))
    if group is None:
        group = join_as_trainer(meta, torch.device("cpu"))
    BucketedBroadcastSender(group, meta.bucket_bytes).send(iter(tensors), specs)
    receiving.result(60)
    return group


def _meta(version: int) -> WeightUpdateMeta:
    return WeightUpdateMeta.collective(
        version,
        "127.0.0.1",
        free_port(),
        2,
        group_name=GROUP,
        backend="gloo",
        bucket_bytes=BUCKET_BYTES,
        timeout_s=60.0,
    )


def test_join_update_leave_from_both_sides_then_join_again(client, http, tiny_qwen2: Path) -> None:
    engine, loop = client
    tensors = ordered_state(tiny_qwen2)  # the served weights: the model is unchanged by these updates
    assert GROUP not in _groups(http)
    for version in (1, 2):  # the second round joins a new group of the same name
        meta = _meta(version)
        group = _update(engine, loop, meta, None, tensors)
        group = _update(engine, loop, meta, group, tensors)  # the joined group is reused
        assert _groups(http) == [GROUP] and engine.weight_groups == [GROUP]
        assert http.get("/get_model_info").json()["weight_version"] == str(version)
        leaving = loop.submit(engine.destroy_weight_groups())
        assert group.destroy(timeout_s=30.0) is True
        assert leaving.result(60) == [GROUP]
        assert _groups(http) == [] and engine.weight_groups == []


def test_the_server_leaves_promptly_after_the_trainer_is_gone(client, http, tiny_qwen2: Path) -> None:
    engine, loop = client
    group = _update(engine, loop, _meta(3), None, ordered_state(tiny_qwen2))
    group.destroy(timeout_s=10.0)  # the trainer leaves alone (or dies)
    started = time.monotonic()
    assert loop.submit(engine.destroy_weight_groups()).result(60) == [GROUP]
    assert time.monotonic() - started < 45.0  # the server's bound (30 s) plus the abort's, at worst
    assert _groups(http) == []
