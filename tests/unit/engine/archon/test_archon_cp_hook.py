"""The attention's context-parallel hook (``Attention.cp_group``): with a one-rank group the Ulysses
path (all-to-all exchanges around the packed kernel) gives the plain path's results and gradients.
Several ranks are the context-parallel engine's tests (gloo, ``tests/distributed``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from areal_tasks.engine.archon.model import build_decoder
from areal_tasks.errors import EngineError


def _scores(model, batch):
    out = model(
        batch.input_ids,
        position_ids=batch.position_ids,
        cu_seqlens=batch.cu_seqlens,
        bounds=batch.bounds,
        labels=batch.labels,
    )
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("family", ["qwen3", "mixtral"])
def test_ulysses_hook_with_one_rank_matches_plain(family, world_of_one, tiny_model_factory, packed):
    model, _ = build_decoder(tiny_model_factory(family))
    batch = packed()
    plain = _scores(model, batch)
    plain.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for layer in model.layers.values():
        layer.self_attn.cp_group = dist.group.WORLD
    hooked = _scores(model, batch)
    hooked.sum().backward()
    torch.testing.assert_close(hooked, plain, atol=1e-6, rtol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-6, rtol=1e-6)


class _FakeGroup:
    def size(self) -> int:
        return 3


def test_ulysses_hook_refuses_indivisible_heads(tiny_model_factory, packed):
    model, _ = build_decoder(tiny_model_factory("llama"))
    model.layers["0"].self_attn.cp_group = _FakeGroup()  # 4 heads over 3 ranks
    with pytest.raises(EngineError, match="must divide the attention heads"):
        _scores(model, packed())
