"""The vLLM adapter speaks vLLM 0.32's names: every field it sends exists in the installed vLLM.

vLLM's request models accept unknown fields (it only logs them), so a misspelt field would be
silently ignored; here the names are checked against the installed vLLM's own schemas.
"""

from __future__ import annotations

import json
import os
import subprocess
import typing

import pytest
from vllm_test_server import VLLM_PYTHON

from areal_tasks.api.inference import PauseMode, SamplingParams
from areal_tasks.inference.client import GenerateInput, make_adapter

pytestmark = pytest.mark.integration

_SCHEMA = """
import json, typing
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.v1.engine import PauseMode
import areal_tasks.inference.vllm_plugin.engine as engine
fields = lambda cls: sorted(cls.__dataclass_fields__)
print(json.dumps({
    "completion": sorted(CompletionRequest.model_fields),
    "pause_modes": list(typing.get_args(PauseMode)),
    "init": fields(engine.GroupInitInfo), "disk": fields(engine.DiskUpdateInfo),
    "bucket": fields(engine.BucketUpdateInfo),
}))
"""


@pytest.fixture(scope="module")
def vllm_schema() -> dict:
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", _SCHEMA],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_completion_fields_exist_in_vllm(vllm_schema: dict) -> None:
    sampling = SamplingParams(max_new_tokens=4, top_k=3, stop=("x",), stop_token_ids=(2,), seed=1)
    body = make_adapter("vllm", model="m").generate(GenerateInput("r-0", [1, 2], sampling)).json
    assert set(body) <= set(vllm_schema["completion"]), set(body) - set(vllm_schema["completion"])


def test_pause_modes_exist_in_vllm(vllm_schema: dict) -> None:
    adapter = make_adapter("vllm")
    sent = {adapter.pause(mode).params["mode"] for mode in typing.get_args(PauseMode)}
    assert sent <= set(vllm_schema["pause_modes"])


def test_weight_update_payloads_fit_the_plugin(vllm_schema: dict) -> None:
    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weight_update import WeightUpdateMeta

    adapter = make_adapter("vllm")
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29500, 2)
    assert set(adapter.init_weight_group(meta, 1).json["init_info"]) == set(vllm_schema["init"])
    bucket = adapter.update_weights_from_distributed(meta, [ParamSpec("w", "float32", (1,))])
    assert set(bucket.json["update_info"]) == set(vllm_schema["bucket"])
    disk = adapter.update_weights_from_disk(WeightUpdateMeta.disk("/w", 1))
    assert set(disk.json["update_info"]) == set(vllm_schema["disk"])
