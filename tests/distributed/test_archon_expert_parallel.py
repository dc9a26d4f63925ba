"""Expert parallelism of the archon engine on 2 and 4 gloo ranks: the ep dispatcher's output and its
gradients (to the tokens, the routing weights and each rank's own experts' weights) equal one
process's :class:`LocalDispatcher` over all experts, in fp32 to 1e-6. The routing leaves an expert
without a token, sends all of rank 0's tokens to other ranks, and (on 4 ranks) gives a rank no token
at all or leaves a whole ep rank without work; with ep < world, each ep group is its own reference."""

from __future__ import annotations

import pytest
import torch
from launch import run_workers
from workers_archon_ep import loop_compute, make_case

from areal_tasks.engine.archon.model.experts import LocalDispatcher

pytestmark = pytest.mark.distributed

TOL = {"atol": 1e-6, "rtol": 1e-6}

CASES = {
    # id: (world, ep, n_experts, tokens per rank, idle experts)
    "w2_ep2": (2, 2, 6, [7, 11], [4]),
    "w2_ep2_idle_rank": (2, 2, 4, [9, 5], [0, 1]),  # ep rank 0's experts get no token
    "w4_ep4": (4, 4, 8, [6, 13, 0, 9], [3]),  # rank 2 has no token
    "w4_ep2": (4, 2, 8, [10, 0, 7, 12], [5]),  # two ep groups of 2
}


def reference(case: dict, ranks: list[int], n_experts: int) -> dict[str, list[torch.Tensor] | torch.Tensor]:
    """LocalDispatcher over all experts on the tokens of ``ranks`` (one ep group) concatenated."""
    x = torch.cat([case["x"][r] for r in ranks]).requires_grad_()
    weight = torch.cat([case["weight"][r] for r in ranks]).requires_grad_()
    experts = case["experts"].clone().requires_grad_()
    index = torch.cat([case["index"][r] for r in ranks])
    out = LocalDispatcher()(x, index, weight, n_experts, loop_compute(experts))
    (out * torch.cat([case["coef"][r] for r in ranks])).sum().backward()
    sizes = [case["x"][r].shape[0] for r in ranks]
    return {
        "out": out.detach().split(sizes),
        "x_grad": x.grad.split(sizes),
        "weight_grad": weight.grad.split(sizes),
        "experts_grad": experts.grad,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_ep_dispatch_equals_one_process_with_all_experts(name, tmp_path):
    world, ep, n_experts, tokens, idle = CASES[name]
    args = {"ep": ep, "n_experts": n_experts, "tokens": tokens, "idle_experts": idle}
    run_workers("workers_archon_ep:ep_dispatch", world, tmp_path, args)
    case = make_case(world, ep, n_experts, tokens, idle)
    for group_start in range(0, world, ep):
        ranks = list(range(group_start, group_start + ep))
        ref = reference(case, ranks, n_experts)
        for i, rank in enumerate(ranks):
            got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
            for key in ("out", "x_grad", "weight_grad"):
                torch.testing.assert_close(
                    got[key], ref[key][i], **TOL, msg=lambda m, k=key, r=rank: f"rank {r} {k}: {m}"
                )
            mine = got["experts"]
            assert mine == list(range(i * n_experts // ep, (i + 1) * n_experts // ep))
            torch.testing.assert_close(
                got["experts_grad"],
                ref["experts_grad"][mine[0] : mine[-1] + 1],
                **TOL,
                msg=lambda m, r=rank: f"rank {r} experts: {m}",
            )
        idle_grads = ref["experts_grad"][idle]
        assert torch.count_nonzero(idle_grads) == 0
