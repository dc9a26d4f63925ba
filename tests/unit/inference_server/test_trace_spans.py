"""The embedded server's weight swap as perf spans: ``swap weights`` holding ``pause``, ``load
weights`` and ``resume``, on the step that made the weights; generation afterwards on the next step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from areal_tasks import trace
from areal_tasks.inference.server.protocol import SwapWeightsReqInput
from areal_tasks.inference.server.server import WeightBounds
from areal_tasks.inference.server.weight_service import WeightService
from areal_tasks.trace.tracer import Tracer


def test_a_swap_is_traced_as_nested_spans_of_its_step(engine, tmp_path: Path) -> None:
    garbage = tmp_path / "roots" / "garbage"
    garbage.mkdir(parents=True)
    (garbage / "model.safetensors").write_bytes(b"not safetensors")
    svc = WeightService(engine, WeightBounds(roots=(str(tmp_path / "roots"),)))
    tracer = trace.install(Tracer(tmp_path / "run" / "trace", "server 0"))
    try:
        success, _, _ = asyncio.run(svc.swap(SwapWeightsReqInput(model_path=str(garbage), weight_version="7")))
        assert not success
        assert tracer.step == 8  # generation from now on feeds step 8
    finally:
        trace.uninstall()
    doc = json.loads(trace.merge_trace(tmp_path / "run").read_text())
    assert trace.check_trace(doc) == []
    spans = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert set(spans) == {"swap weights", "pause", "load weights", "resume"}
    outer = spans["swap weights"]
    assert outer["args"]["version"] == "7" and outer["args"]["step"] == 7
    for name in ("pause", "load weights", "resume"):
        inner = spans[name]
        assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert spans["pause"]["ts"] + spans["pause"]["dur"] <= spans["load weights"]["ts"] <= spans["resume"]["ts"]
