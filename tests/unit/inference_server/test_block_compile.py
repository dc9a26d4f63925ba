"""Whole-block compile for captured decode steps: the swap of block forwards is scoped to its
context (restored after an error too), the cache view then uses the storage it is handed, and a
bad ``compile_scope`` is refused before anything loads. (Compiled output equal to eager decode is
checked on a GPU: ``tests/integration/inference_server/test_gpu_graphs.py``.)"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.block_compile import CompiledBlocks
from areal_tasks.inference.server.cuda_graph import GraphModelRunner, StaticCacheView
from areal_tasks.inference.server.kv_cache import SlotKVCache
from areal_tasks.inference.server.model_runner import RunnerConfig


class _Recorder:
    def __init__(self) -> None:
        self.layers: list[int] = []

    def use_layer(self, layer: int) -> None:
        self.layers.append(layer)


def test_compiled_forwards_are_swapped_in_only_inside_the_context() -> None:
    blocks = [torch.nn.Linear(2, 2) for _ in range(3)]
    compiled = CompiledBlocks(blocks)
    view = _Recorder()
    with compiled.active(view):
        assert all("forward" in block.__dict__ for block in blocks)
    assert all("forward" not in block.__dict__ for block in blocks)
    with pytest.raises(ValueError, match="boom"):
        with compiled.active(view):
            raise ValueError("boom")
    assert all("forward" not in block.__dict__ for block in blocks)
    x = torch.ones(1, 2)
    assert torch.equal(blocks[0](x), torch.nn.functional.linear(x, blocks[0].weight, blocks[0].bias))


def test_static_view_writes_the_storage_it_was_handed() -> None:
    store = SlotKVCache(num_slots=2, max_len=8, device=torch.device("cpu"))
    like = torch.zeros(2, 1, 1, 4)
    store.layer(0, like), store.layer(1, like)
    view = StaticCacheView(store, torch.tensor([3, 5]), kv_len=8)
    view.use_layer(1)
    keys, _ = view.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4), layer_idx=0)
    assert store.keys[1][0, 0, 3].sum() == 4 and store.keys[1][1, 0, 5].sum() == 4
    assert store.keys[0].sum() == 0  # the index the model passed was not used
    assert keys.shape == (2, 1, 8, 4)


def test_unknown_compile_scope_is_refused(tiny_qwen2) -> None:
    cfg = RunnerConfig(str(tiny_qwen2), device="cpu", compile_scope="everything")
    with pytest.raises(InferenceError, match="compile_scope must be one of pointwise, blocks"):
        GraphModelRunner(cfg, capture=False)
