"""Whole-block compile for captured decode steps: the swap of block forwards is scoped to its
context (restored after an error too), the cache view then uses the storage it is handed, and a
bad ``compile_scope`` is refused before anything loads; on the CPU, compiled blocks decode exactly
as eager ones with one set of graphs for every block and the cache write left out of them.
(Captured on a GPU: ``tests/integration/inference_server/test_gpu_graphs.py``.)"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.block_compile import CompiledBlocks
from areal_tasks.inference.server.cuda_graph import GraphModelRunner, StaticCacheView
from areal_tasks.inference.server.kv_cache import SlotKVCache
from areal_tasks.inference.server.model_runner import RunnerConfig
from areal_tasks.models import build_tiny_model
from areal_tasks.models.compile import decoder_blocks


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
    with pytest.raises(ValueError, match="boom"), compiled.active(view):
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
    keys, values = view.update(torch.ones(2, 1, 1, 4), torch.full((2, 1, 1, 4), 2.0), layer_idx=0)
    assert store.keys[1][0, 0, 3].sum() == 4 and store.keys[1][1, 0, 5].sum() == 4
    assert store.values[1][0, 0, 3].sum() == 8 and store.values[1][1, 0, 5].sum() == 8
    assert store.keys[1].sum() == 8 and store.values[1].sum() == 16  # nothing else written
    assert store.kv[0].sum() == 0  # the index the model passed was not used
    assert keys.shape == values.shape == (2, 1, 8, 4)


def test_unknown_compile_scope_is_refused(tiny_qwen2) -> None:
    cfg = RunnerConfig(str(tiny_qwen2), device="cpu", compile_scope="everything")
    with pytest.raises(InferenceError, match="compile_scope must be one of pointwise, blocks"):
        GraphModelRunner(cfg, capture=False)


def _greedy_logits(runner: GraphModelRunner, steps: int) -> torch.Tensor:
    out = []
    with torch.inference_mode():
        for slot in range(3):
            runner.prefill(slot, [1 + slot, 5, 7, 9])
        tokens = [3, 4, 5]
        for step in range(steps):
            logits = runner.decode([0, 1, 2], tokens, [4 + step] * 3)
            tokens = logits.argmax(-1).tolist()
            out.append(logits)
    return torch.stack(out)


def test_compiled_blocks_decode_like_eager_with_one_graph_set_for_all_blocks() -> None:
    layers = 4
    path = build_tiny_model("qwen2", seed=0, num_hidden_layers=layers)
    cfg = RunnerConfig(str(path), device="cpu", dtype="float32", max_running_requests=4, context_length=32)
    want = _greedy_logits(GraphModelRunner(cfg, capture=False), 4)
    compiled = GraphModelRunner(cfg, capture=False)
    compiled._block_forwards = CompiledBlocks(decoder_blocks(compiled.model))  # on CUDA: compile_scope="blocks"
    torch._dynamo.reset()
    counters.clear()
    got = _greedy_logits(compiled, 4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a block's layer index specialised per block would compile at least 3 graphs a block
    assert 0 < counters["stats"]["unique_graphs"] < 3 * layers
    # the only graph break is the cache write, which must never be traced (a copy of the whole store)
    breaks = list(counters["graph_break"])
    assert breaks and all("write_at_positions" in reason for reason in breaks), breaks
