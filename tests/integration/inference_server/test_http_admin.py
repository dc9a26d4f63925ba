"""Admin endpoints over HTTP: API key, pause/continue, disk weight updates, cache flush, metrics."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest
from embedded_server import hf_greedy
from server_metrics import QUEUED, RUNNING, metric, wait_idle, wait_metric

from areal_tasks.models import build_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8, 9]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize(
    "path",
    [
        "/pause_generation",
        "/continue_generation",
        "/update_weights_from_disk",
        "/init_weights_update_group",
        "/update_weights_from_distributed",
        "/begin_weight_update",
        "/flush_cache",
        "/abort_request",
    ],
)
def test_admin_endpoints_need_the_admin_key(http, path: str) -> None:
    assert http.post(path, json={}).status_code == 401
    wrong = http.post(path, json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json() == {"error": "Unauthorized"}


def test_open_endpoints_need_no_key(http) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/metrics").status_code == 200
    assert (
        http.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}).status_code == 200
    )


def test_pause_abort_returns_partial_output_and_holds_new_requests(http, admin_headers) -> None:
    wait_idle(http)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        victim = pool.submit(
            http.post,
            "/generate",
            json={"input_ids": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 2000, **GREEDY}},
        )
        wait_metric(http, RUNNING, 1)
        try:  # the server continues whatever fails here: a server left paused stalls every later test
            paused = http.post("/pause_generation", json={"mode": "abort"}, headers=admin_headers)
            assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
            out = victim.result(timeout=60).json()
            meta = out["meta_info"]
            assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["status_code"] is None
            assert 0 < len(out["output_ids"]) < 2000
            assert len(meta["output_token_logprobs"]) == len(out["output_ids"])
            late = pool.submit(
                http.post, "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, **GREEDY}}
            )
            wait_metric(http, QUEUED, 1)
            assert metric(http, "areal:paused") == 1 and not late.done()
        finally:
            resumed = http.post("/continue_generation", json={}, headers=admin_headers)
        assert resumed.json()["status"] == "ok"
        assert late.result(timeout=60).json()["meta_info"]["finish_reason"]["type"] == "length"


def _write_weights(source: Path, target: Path) -> Path:
    from areal_tasks.models.safetensors_dir import read_safetensors_dir, write_safetensors_shards
    from storage.atomic import atomic_directory

    state = read_safetensors_dir(source)
    with atomic_directory(target, on_exists="replace_owned") as staging:
        write_safetensors_shards(state, staging, max_shard_bytes=sum(t.nbytes for t in state.values()) // 2)
    return target


def test_update_weights_from_disk_changes_outputs_and_bumps_the_version(
    http, admin_headers, reference, tiny_qwen2: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    other_dir = build_tiny_model("qwen2", seed=1)
    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    shards = _write_weights(other_dir, tmp_path / "v-next")
    before = http.get("/get_model_info").json()["weight_version"]
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, **GREEDY}}
    try:
        done = http.post("/update_weights_from_disk", json={"model_path": str(shards)}, headers=admin_headers)
        assert done.status_code == 200, done.text
        assert done.json() == {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }
        info = http.get("/get_model_info").json()
        assert info["weight_version"] == str(int(before) + 1) and info["model_path"] == str(shards)
        out = http.post("/generate", json=body).json()
        assert out["output_ids"] == hf_greedy(other, PROMPT, 8) != hf_greedy(reference, PROMPT, 8)
        assert out["meta_info"]["weight_version"] == info["weight_version"]
        bad = http.post(
            "/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")}, headers=admin_headers
        )
        assert bad.status_code == 400 and bad.json()["success"] is False
        assert http.get("/get_model_info").json()["weight_version"] == info["weight_version"]
    finally:
        restored = http.post(
            "/update_weights_from_disk",
            json={"model_path": str(tiny_qwen2), "weight_version": "42"},
            headers=admin_headers,
        )
    assert restored.json()["success"] is True
    assert http.get("/get_model_info").json()["weight_version"] == "42"
    assert http.post("/generate", json=body).json()["output_ids"] == hf_greedy(reference, PROMPT, 8)


def test_update_while_paused_in_place_reports_the_unflushed_cache(http, admin_headers, tiny_qwen2: Path) -> None:
    # long enough that the request is still running when the pause lands, even on a loaded machine
    new_tokens = 600
    wait_idle(http)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            http.post,
            "/generate",
            json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": new_tokens, **GREEDY}},
        )
        wait_metric(http, RUNNING, 1)
        try:  # the server continues whatever fails here: a server left paused stalls every later test
            paused = http.post("/pause_generation", json={"mode": "in_place"}, headers=admin_headers)
            assert paused.status_code == 200, paused.text
            flushed = http.post("/flush_cache", headers=admin_headers)
            assert flushed.status_code == 400, (flushed.status_code, flushed.text, running.done())
            version = http.get("/get_model_info").json()["weight_version"]
            new_version = str(int(version) + 100)
            update = http.post(
                "/update_weights_from_disk",
                headers=admin_headers,
                json={"model_path": str(tiny_qwen2), "weight_version": new_version},
            )
            assert update.status_code == 400 and "cache was not flushed" in update.json()["message"], update.text
        finally:
            resumed = http.post("/continue_generation", json={}, headers=admin_headers)
        assert resumed.status_code == 200, resumed.text
        out = running.result(timeout=60).json()
    spans = out["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == [version, new_version]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == new_tokens
    assert http.post("/flush_cache", headers=admin_headers).status_code == 200


def test_metrics_count_tokens_and_requests(http) -> None:
    before = metric(http, "sglang:generation_tokens_total")
    finished = metric(http, "sglang:num_requests_total")
    http.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5, **GREEDY}})
    assert metric(http, "sglang:generation_tokens_total") == before + 5
    assert metric(http, "sglang:num_requests_total") == finished + 1
    assert metric(http, "sglang:gen_throughput") > 0
    text = http.get("/metrics").text
    assert "# TYPE sglang:num_running_reqs gauge" in text and "# TYPE sglang:token_usage gauge" in text


def test_update_on_a_running_server_waits_for_requests_in_flight(http, admin_headers, tiny_qwen2: Path) -> None:
    version = http.get("/get_model_info").json()["weight_version"]
    new_version = str(int(version) + 1)
    wait_idle(http)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = pool.submit(
            http.post, "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1500, **GREEDY}}
        )
        wait_metric(http, RUNNING, 1)
        update = pool.submit(
            http.post,
            "/update_weights_from_disk",
            headers=admin_headers,
            json={"model_path": str(tiny_qwen2), "weight_version": new_version},
        )
        wait_metric(http, "areal:weight_update_draining", 1)
        late = pool.submit(http.post, "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
        wait_metric(http, QUEUED, 1)
        first = running.result(timeout=120).json()["meta_info"]
        assert update.result(timeout=120).json()["success"] is True
        second = late.result(timeout=120).json()["meta_info"]
    # the request in flight ran to its end on the old weights; the one that came during the update waited
    assert first["weight_version"] == version and "weight_versions" not in first
    assert first["completion_tokens"] == 1500
    assert second["weight_version"] == new_version
