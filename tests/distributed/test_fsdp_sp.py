"""Ulysses sequence parallelism (sp=2 on 2 gloo ranks, all-to-all over heads on packed sequences)
matches a single-process transformers reference in loss, gradients, global grad norm and forward
log-probs (fp32, 1e-5). Besides qwen2: qwen3 (q/k norms), mistral with a 4-token sliding window
(the window enters the block mask) and qwen2 with one KV head (fewer KV heads than sp ranks)."""

from __future__ import annotations

import pytest
from engine_helpers import assert_family_results_match_reference
from launch import run_workers


@pytest.mark.distributed
def test_sp2_matches_reference(tiny_model_factory, tmp_path):
    from areal_tasks.models import build_tiny_model

    dirs = {
        "qwen2": str(tiny_model_factory("qwen2")),
        "qwen3": str(tiny_model_factory("qwen3")),
        "mistral_window4": str(build_tiny_model("mistral", sliding_window=4)),
        "qwen2_one_kv_head": str(build_tiny_model("qwen2", num_key_value_heads=1)),
    }
    run_workers("workers_fsdp:family_grads", 2, tmp_path, {"model_dirs": dirs, "sp": 2})
    assert_family_results_match_reference(tmp_path, dirs)
