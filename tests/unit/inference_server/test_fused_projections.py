"""Fused input projections: the modules' parameters become views of one weight (so in-place
weight updates reach it), their own forwards are unchanged outside ``active()``, and inside it they
share one GEMM whose slices equal the separate products."""

from __future__ import annotations

import torch

from areal_tasks.inference.server.fused_projections import FusedGroup, fuse_input_projections


class _Attention(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(8, 8, bias=bias)
        self.k_proj = torch.nn.Linear(8, 4, bias=bias)
        self.v_proj = torch.nn.Linear(8, 4, bias=bias)


class _Block(torch.nn.Module):
    def __init__(self, bias: bool = True, mlp_in: int = 8) -> None:
        super().__init__()
        self.self_attn = _Attention(bias)
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj = torch.nn.Linear(8, 16, bias=False)
        self.mlp.up_proj = torch.nn.Linear(mlp_in, 16, bias=False)


def _outputs(attn: _Attention, x: torch.Tensor) -> list[torch.Tensor]:
    return [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]


def test_parameters_become_views_of_the_fused_weight_and_updates_reach_it() -> None:
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(5, 8)
    before = _outputs(block.self_attn, x)
    groups = fuse_input_projections([block])
    assert len(groups) == 2
    attn_group = groups[0]
    assert block.self_attn.k_proj.weight.data_ptr() == attn_group.weight[8:12].data_ptr()
    assert block.self_attn.v_proj.bias.data_ptr() == attn_group.bias[12:16].data_ptr()
    for got, want in zip(_outputs(block.self_attn, x), before):  # eager forwards unchanged
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # a weight update copies into the parameter in place
        block.self_attn.k_proj.weight.copy_(torch.ones(4, 8))
    assert torch.equal(attn_group.weight[8:12], torch.ones(4, 8))
    with attn_group.active():
        shared = _outputs(block.self_attn, x)
    torch.testing.assert_close(shared[1], x @ torch.ones(8, 4) + block.self_attn.k_proj.bias)
    torch.testing.assert_close(shared[0], before[0])
    assert "forward" not in block.self_attn.q_proj.__dict__


def test_one_gemm_serves_the_group_and_a_new_input_recomputes() -> None:
    group = FusedGroup([torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)])
    calls = []
    real = torch.nn.functional.linear

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    torch.nn.functional.linear = counting
    try:
        with group.active():
            x, y = torch.randn(3, 8), torch.randn(3, 8)
            group.modules[0](x), group.modules[1](x)
            assert len(calls) == 1
            second = group.modules[0](y)  # another input: its own product
            assert len(calls) == 2
            torch.testing.assert_close(second, real(y, group.modules[0].weight, group.modules[0].bias))
    finally:
        torch.nn.functional.linear = real


def test_projections_that_cannot_share_a_gemm_are_left_alone() -> None:
    block = _Block(mlp_in=6)  # gate and up read inputs of different sizes
    groups = fuse_input_projections([block])
    assert [len(g.modules) for g in groups] == [3]
    plain = torch.nn.Module()  # no q/k/v names at all
    assert fuse_input_projections([plain]) == []
    mixed = _Block()
    mixed.self_attn.v_proj = torch.nn.Linear(8, 4, bias=False)  # biases neither all present nor all absent
    assert [len(g.modules) for g in fuse_input_projections([mixed])] == [2]
