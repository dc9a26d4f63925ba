"""A vision-language model (tiny Qwen2-VL) on two FSDP ranks (gloo, CPU): the loss, every gradient
(the vision tower's included), one clipped AdamW step and the forward log-probs equal one plain
transformers model on the whole batch, although some micro-batches hold no image (the engine's
dummy image keeps the ranks' gradient reductions in step)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import ATOL, RTOL, max_abs_diff
from launch import run_workers
from workers_vision import IMAGES

from tests.unit.engine.vision_helpers import load_reference, reference_logprobs, token_mean_loss, vision_batch

pytestmark = pytest.mark.distributed


def test_dp2_vlm_step_equals_transformers(tiny_qwen2_vl, tmp_path):
    run_workers("workers_vision:vlm_grads_and_step", 2, tmp_path, {"model_dir": str(tiny_qwen2_vl), "n_mbs": 2})
    result = torch.load(tmp_path / "result.pt", weights_only=False)

    batch = vision_batch(seed=7, images=IMAGES)
    model = load_reference(tiny_qwen2_vl)
    loss, _ = token_mean_loss({"logprobs": reference_logprobs(model, batch)}, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01).step()

    assert result["stats"]["loss"] == pytest.approx(float(loss.detach()), abs=ATOL)
    diff, name = max_abs_diff(result["grads"], grads)
    assert diff < ATOL, f"gradient of {name} differs by {diff}"
    assert result["step_stats"]["grad_norm"] == pytest.approx(float(norm), rel=RTOL)
    diff, name = max_abs_diff(result["params"], {n: p.detach() for n, p in model.named_parameters()})
    assert diff < ATOL, f"parameter {name} after one step differs by {diff}"
    with torch.no_grad():
        expected = reference_logprobs(model, batch)
    torch.testing.assert_close(result["forward"]["logprobs"], expected, atol=ATOL, rtol=RTOL)
    # a weight update publishes the trained parameters under the names of transformers' model class
    assert result["published"].keys() == model.state_dict().keys()
    for name, tensor in result["published"].items():
        torch.testing.assert_close(tensor, result["params"][name], atol=0, rtol=0)
