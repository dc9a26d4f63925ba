"""The archon pipeline runner against a single-process run of the full toy decoder (fp32, gloo):
for every schedule, the per-micro-batch losses and stats (the same on every pp rank), the gradients
of every parameter (gathered by global name from the stages), the eval losses and the forward-only
outputs equal the reference to 1e-6, and the batch loss does not depend on 2 vs 4 micro-batches."""

from __future__ import annotations

import pytest
import torch
from launch import run_workers
from workers_archon_pp import HIDDEN, VOCAB, micro_batches, toy_loss

from areal_tasks.kernels.logprobs import align_to_tokens
from tests.fixtures.archon_pp_toy import make_toy

pytestmark = pytest.mark.distributed

ATOL = 1e-6
N_MBS = (1, 2, 3, 4)


def reference(n_mbs: int, *, n_layers: int, n_experts: int, role: str) -> dict:
    """Losses, stats, gradients and forward outputs of the full toy model, one micro-batch at a time."""
    model = make_toy(0, vocab=VOCAB, hidden=HIDDEN, n_layers=n_layers, n_experts=n_experts, role=role)
    mbs = micro_batches(n_mbs)
    weights = [float(mb["loss_mask"].sum()) for mb in mbs]
    total = sum(weights)
    per_mb, forward = [], []
    for mb, weight in zip(mbs, weights):
        ids, cu = mb["input_ids"], mb["cu_seqlens"]
        labels = torch.roll(ids, -1).unsqueeze(0) if role == "actor" else None
        out = model(
            ids.unsqueeze(0),
            position_ids=mb["position_ids"].unsqueeze(0),
            cu_seqlens=cu.to(torch.int32),
            bounds=tuple(cu.tolist()),
            labels=labels,
        )
        out, aux = out if n_experts else (out, None)
        if role == "critic":
            outputs = {"values": align_to_tokens(out[0, :, 0], cu)}
        else:
            outputs = {
                "logprobs": align_to_tokens(out[0, :, 0], cu),
                "entropy": align_to_tokens(out[0, :, 1].detach(), cu),
            }
        forward.append({k: v.detach() for k, v in outputs.items()})
        if aux is not None:
            outputs["moe_aux"] = aux
        loss, stats = toy_loss(outputs, mb)
        (loss * (weight / total)).backward()
        per_mb.append({"loss": float(loss.detach()), **{k: float(v) for k, v in stats.items()}})
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {"per_mb": per_mb, "grads": grads, "forward": forward, "weights": weights}


def check(
    tmp_path, world: int, *, n_layers: int = 4, n_experts: int = 0, role: str = "actor", grad_scale: float = 1.0
) -> None:
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    batch_losses = []
    for n_mbs in N_MBS:
        ref = reference(n_mbs, n_layers=n_layers, n_experts=n_experts, role=role)
        grads: dict[str, torch.Tensor] = {}
        for r, saved in enumerate(ranks):
            res = saved["results"][n_mbs]
            assert res["train"] == ranks[0]["results"][n_mbs]["train"], f"rank {r} got other stats"
            assert len(res["train"]) == n_mbs
            for got, want in zip(res["train"], ref["per_mb"]):
                assert got.keys() == want.keys()
                for key in want:
                    assert got[key] == pytest.approx(want[key], abs=ATOL), (n_mbs, key)
            for got, want in zip(res["eval"], res["train"]):
                assert got == pytest.approx(want, abs=ATOL)
            for got, want in zip(res["forward"], ref["forward"]):
                assert got.keys() == want.keys()
                for key in want:
                    torch.testing.assert_close(got[key], want[key], atol=ATOL, rtol=0)
            assert not grads.keys() & res["grads"].keys(), "a parameter lives on two ranks"
            grads.update(res["grads"])
        assert grads.keys() == ref["grads"].keys()
        for name, want in ref["grads"].items():
            torch.testing.assert_close(grads[name], want * grad_scale, atol=ATOL, rtol=0, msg=f"gradient of {name}")
        res = ranks[0]["results"][n_mbs]
        batch_losses.append(res["train_sums"]["loss"] / sum(res["weights"]))
    if not n_experts:  # the MoE balance term is not linear in the tokens: it depends on the split
        assert batch_losses == pytest.approx([batch_losses[0]] * len(N_MBS), abs=ATOL)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_stage_per_rank(schedule, tmp_path):
    run_workers("workers_archon_pp:pipeline_step", 2, tmp_path, {"schedule": schedule}, timeout_s=120)
    check(tmp_path, 2)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev"])
def test_two_stages_per_rank(schedule, tmp_path):
    run_workers(
        "workers_archon_pp:pipeline_step", 2, tmp_path, {"schedule": schedule, "stages_per_rank": 2}, timeout_s=120
    )
    check(tmp_path, 2)


@pytest.mark.parametrize("schedule", ["1f1b", "zbv"])
def test_moe_aux_travels_with_the_activations(schedule, tmp_path):
    v = 2 if schedule == "zbv" else 1
    args = {"schedule": schedule, "stages_per_rank": v, "n_experts": 3}
    run_workers("workers_archon_pp:pipeline_step", 2, tmp_path, args, timeout_s=120)
    check(tmp_path, 2, n_experts=3)


def test_grad_scale_multiplies_the_gradients(tmp_path):
    """``grad_scale`` (the FSDP group size the data-parallel mean divides by) scales every gradient."""
    run_workers("workers_archon_pp:pipeline_step", 2, tmp_path, {"schedule": "1f1b", "grad_scale": 2.0}, timeout_s=120)
    check(tmp_path, 2, grad_scale=2.0)


def test_critic(tmp_path):
    run_workers("workers_archon_pp:pipeline_step", 2, tmp_path, {"schedule": "1f1b", "role": "critic"}, timeout_s=120)
    check(tmp_path, 2, role="critic")


def test_four_ranks_interleaved(tmp_path):
    args = {"schedule": "interleaved_1f1b", "stages_per_rank": 2, "n_layers": 8}
    run_workers("workers_archon_pp:pipeline_step", 4, tmp_path, args, timeout_s=120)
    check(tmp_path, 4, n_layers=8)
