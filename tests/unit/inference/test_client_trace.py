"""The client's perf spans against fake SGLang servers: one ``generate`` per call holding its
``generate request`` (same rid prefix), concurrent calls on lanes of their own, all nesting."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fake_sglang import FakeCluster, make_engine

from areal_tasks import trace
from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.trace.tracer import Tracer


def test_concurrent_generate_calls_are_traced_on_lanes(tmp_path: Path) -> None:
    async def scenario() -> list[str]:
        cluster = FakeCluster(2)
        async with make_engine(cluster) as engine:
            responses = await asyncio.gather(
                *(engine.agenerate(ModelRequest([10, 20], SamplingParams(max_new_tokens=3))) for _ in range(4))
            )
        return [r.rid for r in responses]

    trace.install(Tracer(tmp_path / "trace", "rollout"))
    try:
        rids = asyncio.run(scenario())
    finally:
        trace.uninstall()
    doc = json.loads(trace.merge_trace(tmp_path).read_text())
    assert trace.check_trace(doc) == []
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    calls = {e["args"]["rid"]: e for e in spans if e["name"] == "generate"}
    assert sorted(calls) == sorted(rids)
    assert all(e["args"]["n_tokens"] == 3 for e in calls.values())
    requests = [e for e in spans if e["name"] == "generate request"]
    assert len(requests) == 4
    for req in requests:
        call = calls[req["args"]["rid"].rsplit("-", 1)[0]]
        assert call["ts"] <= req["ts"] and req["ts"] + req["dur"] <= call["ts"] + call["dur"]
    assert len({e["tid"] for e in spans}) >= 2  # overlapping calls took lanes of their own
