"""The embedded server's one-request swap (``/areal/swap_weights``) carries exactly the fields of
the load it stands for, for each mode, as the client's per-mode table builds that load; an update
of several buckets, or a backend without the route, goes step by step. A failed swap leaves the
client serving (the server resumed on its old weights)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_sglang import FakeCluster

from areal_tasks.api.inference import ModelRequest, ParamSpec, SamplingParams, plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceControlError
from areal_tasks.inference.admin_paths import SWAP_WEIGHTS_PATH
from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
from areal_tasks.inference.client.weights import WeightSync

SPECS = [ParamSpec("w", "bfloat16", (4, 3)), ParamSpec("b", "float32", (5,))]
BUFFER = {"kind": "file", "id": "a", "nbytes": 44, "path": "/dev/shm/a"}
DESCRIBED = {"names": ["w", "b"], "dtypes": ["bfloat16", "float32"], "shapes": [[4, 3], [5]]}


def _sync(backend: str) -> WeightSync:
    return WeightSync(None, make_adapter(backend), ranks_per_server=1, update_timeout_s=5.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("meta", "buckets", "fields"),
    [
        (WeightUpdateMeta.disk("/w/v3", 3), None, {"model_path": "/w/v3"}),
        (
            WeightUpdateMeta.collective(3, "127.0.0.1", 29000, 2, group_name="g"),
            [SPECS],
            {**DESCRIBED, "group_name": "g"},
        ),
        (WeightUpdateMeta.shared(3, (BUFFER,)), [SPECS], {**DESCRIBED, "shared_buffers": [BUFFER]}),
    ],
)
def test_the_swap_carries_the_fields_of_its_load(meta: WeightUpdateMeta, buckets, fields: dict) -> None:
    call = _sync("embedded").swap_call(meta, buckets, "in_place", flush_cache=False)
    assert call is not None and call.method == "POST" and call.path == SWAP_WEIGHTS_PATH
    assert call.json == {"mode": "in_place", "weight_version": "3", "flush_cache": False, **fields}


def test_several_buckets_or_another_backend_go_step_by_step() -> None:
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29000, 2)
    several = plan_weight_buckets(SPECS, bucket_bytes=24)
    assert len(several) == 2
    assert _sync("embedded").swap_call(meta, several, "abort", flush_cache=True) is None
    for backend in ("sglang", "vllm"):
        assert _sync(backend).swap_call(WeightUpdateMeta.disk("/w", 1), None, "abort", flush_cache=True) is None


def test_a_swap_without_its_plan_or_buffers_is_refused_before_any_call() -> None:
    sync = _sync("embedded")
    with pytest.raises(InferenceControlError, match="needs the bucket plan"):
        sync.swap_call(WeightUpdateMeta.collective(1, "127.0.0.1", 29000, 2), None, "abort", flush_cache=True)
    with pytest.raises(InferenceControlError, match="names no buffer"):
        sync.swap_call(WeightUpdateMeta.shared(1), [SPECS], "abort", flush_cache=True)


def test_a_failed_one_request_swap_leaves_the_client_serving_at_its_old_version() -> None:
    """The server resumes after a failed ``/areal/swap_weights`` (old weights, old version): the
    client raises, but lets requests through again at the version it had."""
    cluster = FakeCluster(1)
    inner = cluster.transport()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == SWAP_WEIGHTS_PATH:
            return httpx.Response(400, json={"success": False, "message": "Failed to update weights: garbage"})
        return await inner.handle_async_request(request)

    async def scenario() -> None:
        engine = RemoteInferenceEngine(
            cluster.addresses,
            make_adapter("embedded"),
            ClientConfig(max_retries=0, request_timeout_s=10.0),
            version=4,
            transport_factory=lambda: httpx.MockTransport(handler),
        )
        async with engine:
            with pytest.raises(InferenceControlError, match="garbage"):
                await engine.swap_weights(WeightUpdateMeta.disk("/w/v5", 5), None, "abort")
            assert engine.get_version() == 4
            done = await asyncio.wait_for(engine.agenerate(ModelRequest([1, 2], SamplingParams(max_new_tokens=2))), 10)
            assert len(done.output_ids) == 2

    asyncio.run(scenario())
