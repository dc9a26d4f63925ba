"""Collective weight updates over HTTP with a trainer process on gloo, as SGLang 0.5.23 does them.

The trainer (``sglang_trainer.py``) hosts the rendezvous and broadcasts; the test drives the server:
``/init_weights_update_group`` (returns once both joined), then per session ``/begin_weight_update``,
``/update_weights_from_distributed`` (per-tensor broadcasts, or one ``flattened_bucket``) and
``/end_weight_update``, checking outputs and the weight version after each step.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from embedded_server import free_port, hf_greedy
from sglang_trainer import ordered_state

from areal_tasks.models import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

PROMPT = [5, 6, 7, 8, 9]
BODY = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}


def _specs(model_dir: Path) -> dict:
    state = ordered_state(model_dir)
    return {
        "names": [n for n, _ in state],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in state],
        "shapes": [list(t.shape) for _, t in state],
    }


def _post(http, path: str, headers: dict, **body) -> dict:
    response = http.post(path, json=body, headers=headers)
    payload = response.json()
    assert response.status_code == (200 if payload.get("success", True) else 400), response.text
    return payload


def test_collective_update_per_tensor_and_flattened_bucket(
    http, admin_headers, reference, tiny_qwen2: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    other_dir = build_tiny_model("qwen2", seed=1)
    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    group = "test_weight_group"
    specs = _specs(other_dir)
    refused = _post(http, "/update_weights_from_distributed", admin_headers, group_name=group, **specs)
    assert refused["success"] is False and "begin_weight_update" in refused["message"]

    port = free_port()
    log = open(tmp_path / "trainer.log", "wb")
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "sglang_trainer.py"),
            "--port",
            str(port),
            "--group",
            group,
            "--per-tensor",
            str(other_dir),
            "--bucket",
            str(tiny_qwen2),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            joined = pool.submit(
                _post,
                http,
                "/init_weights_update_group",
                admin_headers,
                master_address="127.0.0.1",
                master_port=port,
                rank_offset=1,
                world_size=2,
                group_name=group,
                backend="gloo",
            )
            assert joined.result(timeout=120)["success"] is True
        start = int(http.get("/get_model_info").json()["weight_version"])

        # session 1: per-tensor broadcasts, no version given -> one bump at end_weight_update
        assert _post(http, "/begin_weight_update", admin_headers)["success"] is True
        assert _post(http, "/begin_weight_update", admin_headers)["success"] is False
        loaded = _post(http, "/update_weights_from_distributed", admin_headers, group_name=group, **specs)
        assert loaded == {"success": True, "message": "Succeeded to update parameter online."}
        assert http.post("/generate", json=BODY).json()["output_ids"] == hf_greedy(other, PROMPT, 8)
        assert http.get("/get_model_info").json()["weight_version"] == str(start)
        assert _post(http, "/end_weight_update", admin_headers)["success"] is True
        assert http.get("/get_model_info").json()["weight_version"] == str(start + 1)

        # session 2: one flattened bucket carrying an explicit version
        _post(http, "/begin_weight_update", admin_headers)
        loaded = _post(
            http,
            "/update_weights_from_distributed",
            admin_headers,
            group_name=group,
            load_format="flattened_bucket",
            weight_version="77",
            **_specs(tiny_qwen2),
        )
        assert loaded["success"] is True and "Weight version updated to 77" in loaded["message"]
        _post(http, "/end_weight_update", admin_headers)
        out = http.post("/generate", json=BODY).json()
        assert out["output_ids"] == hf_greedy(reference, PROMPT, 8)
        assert out["meta_info"]["weight_version"] == "77"
        assert trainer.wait(timeout=60) == 0
        assert _post(http, "/destroy_weights_update_group", admin_headers, group_name=group)["success"] is True
        assert _post(http, "/end_weight_update", admin_headers)["success"] is False
    finally:
        if trainer.poll() is None:
            os.kill(trainer.pid, signal.SIGKILL)
            trainer.wait(timeout=30)
        log.close()
