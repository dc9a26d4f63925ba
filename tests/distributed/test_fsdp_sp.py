"""Ulysses sequence parallelism (sp=2 on 2 gloo ranks, all-to-all over heads on packed sequences)
matches a single-process transformers reference in loss, gradients, global grad norm and forward
log-probs (fp32, 1e-5). Besides qwen2: qwen3 (q/k norms), mistral with a 4-token sliding window
(the window enters the block mask) and qwen2 with one KV head (fewer KV heads than sp ranks)."""

from __future__ import annotations

import pytest
import torch

from engine_helpers import ATOL, RTOL, make_batch, max_abs_diff, reference_grads, reference_logprobs
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
    batch = make_batch(seed=0)
    for family, model_dir in dirs.items():
        result = torch.load(tmp_path / f"{family}.pt", weights_only=False)
        loss, grads, model = reference_grads(model_dir, batch)
        assert result["stats"]["loss"] == pytest.approx(loss, abs=ATOL), family
        diff, name = max_abs_diff(result["grads"], grads)
        assert diff < ATOL, f"{family}: gradient of {name} differs by {diff}"
        ref_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
        assert result["norm"] == pytest.approx(float(ref_norm), rel=RTOL), f"{family}: global grad norm"
        with torch.no_grad():
            torch.testing.assert_close(result["forward"]["logprobs"], reference_logprobs(model, batch),
                                       atol=ATOL, rtol=RTOL)
