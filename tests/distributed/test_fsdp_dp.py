"""Loss normalisation: 1 vs 4 micro-batches and dp=1 vs dp=2 give the same loss, gradients and
clipped AdamW step as one plain transformers model run on the whole batch (fp32, 1e-5), with the
model sharded per decoder block or as one FSDP unit (``fsdp_wrap``)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import ATOL, RTOL, make_batch, max_abs_diff, reference_grads
from launch import run_workers

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def reference(tiny_qwen2):
    batch = make_batch(seed=0)
    loss, grads, model = reference_grads(tiny_qwen2, batch)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        from engine_helpers import reference_logprobs

        logprobs = reference_logprobs(model, batch)
    return {"loss": loss, "grads": grads, "norm": float(norm), "params": params, "logprobs": logprobs}


def _check(result: dict, ref: dict) -> None:
    assert result["stats"]["loss"] == pytest.approx(ref["loss"], abs=ATOL)
    diff, name = max_abs_diff(result["grads"], ref["grads"])
    assert diff < ATOL, f"gradient of {name} differs by {diff}"
    assert result["step_stats"]["grad_norm"] == pytest.approx(ref["norm"], rel=RTOL)
    diff, name = max_abs_diff(result["params"], ref["params"])
    assert diff < ATOL, f"parameter {name} after one step differs by {diff}"
    torch.testing.assert_close(result["forward"]["logprobs"], ref["logprobs"], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("world", [1, 2], ids=["dp1", "dp2"])
def test_micro_batches_and_dp_give_reference_gradients(world, tiny_qwen2, reference, tmp_path):
    run_workers("workers_fsdp:grads_and_step", world, tmp_path, {"model_dir": str(tiny_qwen2), "n_mbs_list": [1, 4]})
    for n_mbs in (1, 4):
        result = torch.load(tmp_path / f"result_mbs{n_mbs}.pt", weights_only=False)
        _check(result, reference)
        # auto: one unit with one rank, a unit per decoder block (and the root) when sharded
        assert len(result["units"]) == (1 if world == 1 else 1 + 2), result["units"]


def test_dp2_with_the_model_as_one_fsdp_unit_gives_reference_gradients(tiny_qwen2, reference, tmp_path):
    """``fsdp_wrap=root`` on two ranks: the same loss, gradients and step, and a weight update
    publishes exactly the trained parameters."""
    run_workers(
        "workers_fsdp:grads_and_step",
        2,
        tmp_path,
        {"model_dir": str(tiny_qwen2), "n_mbs_list": [1, 4], "fsdp_wrap": "root"},
    )
    for n_mbs in (1, 4):
        result = torch.load(tmp_path / f"result_mbs{n_mbs}.pt", weights_only=False)
        _check(result, reference)
        assert result["units"] == [""]
        published = {k: v for k, v in result["published"].items() if k in result["params"]}
        assert published.keys() == result["params"].keys()
        for name, tensor in published.items():
            torch.testing.assert_close(tensor, result["params"][name], atol=0, rtol=0)
