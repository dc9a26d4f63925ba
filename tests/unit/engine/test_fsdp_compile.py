"""Whole-block ``torch.compile`` for training: which scope the engine picks, and that compiled blocks
match the eager model on packed micro-batches of changing length without graph breaks or a recompile
per block or per length (the property that keeps the GPU step's host work small)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.fsdp.compile import (
    AUTO_BLOCKS_PER_GRAPH,
    blocks_per_graph,
    compile_whole_blocks,
    resolve_compile_scope,
)
from areal_tasks.errors import EngineError
from areal_tasks.kernels.attention import VARLEN_ATTN, register_varlen_attention
from areal_tasks.models.compile import decoder_blocks


@pytest.mark.parametrize(
    "setting, attn, sp, device, scope",
    [
        ("auto", VARLEN_ATTN, 1, "cuda", "blocks"),
        ("auto", VARLEN_ATTN, 1, "cpu", "pointwise"),  # CPU attention runs per sequence from host bounds
        ("auto", "flash_attention_2", 1, "cuda", "pointwise"),
        ("auto", VARLEN_ATTN, 2, "cuda", "pointwise"),
        ("blocks", "sdpa", 1, "cpu", "blocks"),
        ("pointwise", VARLEN_ATTN, 1, "cuda", "pointwise"),
    ],
)
def test_scope_resolution(setting, attn, sp, device, scope):
    assert resolve_compile_scope(setting, attn_implementation=attn, sp=sp, device_type=device) == scope


def test_blocks_with_ulysses_and_unknown_scopes_are_refused():
    with pytest.raises(EngineError, match="compile_scope=blocks needs sp=1"):
        resolve_compile_scope("blocks", attn_implementation=VARLEN_ATTN, sp=2, device_type="cuda")
    with pytest.raises(EngineError, match="auto, blocks or pointwise"):
        resolve_compile_scope("everything", attn_implementation=VARLEN_ATTN, sp=1, device_type="cuda")


#: packed micro-batches of changing total length, sequence count and longest sequence
LENGTHS = [[5, 9, 3], [7, 12, 4, 6], [11, 2, 8, 8, 1], [20], [3, 3, 3, 3, 3, 3], [14, 9], [1, 30, 2]]


def _packed_inputs(lengths: list[int], vocab: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths])
    return {
        "input_ids": torch.randint(0, vocab, (1, total), generator=gen),
        "position_ids": positions[None],
        "use_cache": False,
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }


def assert_matches_eager(compiled, eager, lengths_list: list[list[int]]) -> None:
    """Logits and accumulated gradients of ``compiled`` equal ``eager``'s on each packed micro-batch."""
    vocab = eager.config.vocab_size
    for seed, lengths in enumerate(lengths_list):
        inputs = _packed_inputs(lengths, vocab, seed)
        want = eager(**inputs).logits
        got = compiled(**inputs).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        got.float().square().mean().backward()
        want.float().square().mean().backward()
        for (name, a), (_, b) in zip(compiled.named_parameters(), eager.named_parameters()):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_compiled_blocks_match_eager_without_graph_breaks_or_per_length_recompiles(tiny_qwen2):
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_pretrained(
        tiny_qwen2, attn_implementation=register_varlen_attention(), dtype=torch.float32
    )
    compiled = AutoModelForCausalLM.from_pretrained(tiny_qwen2, attn_implementation=VARLEN_ATTN, dtype=torch.float32)
    blocks = decoder_blocks(compiled)
    assert len(blocks) >= 2
    torch._dynamo.reset()
    counters.clear()
    names = compile_whole_blocks(compiled, blocks)
    assert len(names) == len(blocks) + 1  # and the final norm
    assert set(compiled.state_dict()) == set(eager.state_dict())  # forwards swapped on instances only
    assert_matches_eager(compiled, eager, LENGTHS)
    assert dict(counters["graph_break"]) == {}
    # a few graphs for every block and length (the blocks, the final norm, one re-specialisation):
    # not one per block or per micro-batch (host bounds in the kwargs would make it one per batch)
    assert counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])


def _block_mask_varlen(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    """A CPU stand-in with the signature of torch's ``varlen_attn`` (token-major ``[T, H, D]``)."""
    from areal_tasks.kernels.attention import block_causal_mask, repeat_heads

    rep = query.shape[1] // key.shape[1]
    q, k, v = (t.transpose(0, 1)[None] for t in (query, key, value))  # [1, heads, T, D]
    k, v = repeat_heads(k, rep), repeat_heads(v, rep)
    mask = block_causal_mask(cu_seq_q, query.shape[0])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)[0].transpose(0, 1)


def test_the_varlen_route_traces_as_one_graph_per_block(tiny_qwen2, monkeypatch):
    """The CUDA route (``packed_kernel`` -> ``varlen_packed`` -> torch's ``varlen_attn``) has no graph
    break inside a block: compiled with ``fullgraph=True``, where a break is an error. CPU has no
    flash kernel, so a stand-in of the same signature computes the attention."""
    import inspect

    from transformers import AutoModelForCausalLM

    from areal_tasks.kernels import attention

    monkeypatch.setattr(attention, "packed_kernel", lambda *args, **kwargs: "varlen")
    monkeypatch.setattr(
        attention, "_varlen", (_block_mask_varlen, frozenset(inspect.signature(_block_mask_varlen).parameters))
    )
    model = AutoModelForCausalLM.from_pretrained(
        tiny_qwen2, attn_implementation=register_varlen_attention(), dtype=torch.float32
    )
    block = decoder_blocks(model)[0]
    eager_forward = block.forward
    torch._dynamo.reset()
    block.forward = torch.compile(eager_forward, dynamic=True, fullgraph=True)
    hidden = model.config.hidden_size
    for seed, lengths in enumerate(LENGTHS[:2]):
        packed = _packed_inputs(lengths, model.config.vocab_size, seed)
        del packed["input_ids"], packed["use_cache"]  # a block takes the hidden states and the rest
        x = torch.randn(1, sum(lengths), hidden)
        kwargs = {"position_embeddings": model.model.rotary_emb(x, packed["position_ids"]), **packed}
        got = block(x, **kwargs)
        want = eager_forward(x, **kwargs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_compiling_the_chunk_kernels_gives_the_lm_head_larger_chunks(tiny_qwen2, monkeypatch):
    """Compiled, a chunk's element-wise work makes no fp32 copies, so the head scores twice the
    rows a chunk (fewer, fuller row reductions: benchmarks/lm_head_chunks.py); eager keeps the
    smaller chunks that bound its fp32 temporaries."""
    from transformers import AutoModelForCausalLM

    from areal_tasks.engine.fsdp.compile import compile_model
    from areal_tasks.kernels import lm_head

    for name in ("forward", "grad", "kind"):  # compile_chunk_kernels swaps them process-wide: restore after
        monkeypatch.setitem(lm_head._kernels, name, lm_head._kernels[name])
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    head = lm_head.install_chunked_head(model)
    assert head is not None and head.chunk == lm_head.default_chunk_size(head.out_features)
    compiled = compile_model(model, decoder_blocks(model), chunked_head=head, scope="pointwise")
    assert head.chunk == lm_head.default_chunk_size(head.out_features, lm_head.COMPILED_CHUNK_ELEMENTS)
    assert head.chunk == 2 * lm_head.default_chunk_size(head.out_features)
    assert f"lm_head chunks of {head.chunk}" in compiled


def test_groups_of_blocks_match_eager_under_checkpointing_and_share_one_graph(tiny_model_factory, monkeypatch):
    import functools

    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    # the grouping is under test here; Inductor's code generation for whole blocks is covered above
    # (on this CPU it would take a minute for a graph of two blocks)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))

    path = tiny_model_factory("qwen2", num_hidden_layers=4)
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=register_varlen_attention(), dtype=torch.float32
    )
    compiled = AutoModelForCausalLM.from_pretrained(path, attn_implementation=VARLEN_ATTN, dtype=torch.float32)
    blocks = decoder_blocks(compiled)
    assert len(blocks) == 4
    for model in (compiled, eager):  # the recomputation replays a whole group
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    torch._dynamo.reset()
    counters.clear()
    compile_whole_blocks(compiled, blocks, per_graph=2)
    assert set(compiled.state_dict()) == set(eager.state_dict())
    assert_matches_eager(compiled, eager, LENGTHS[:2])
    assert dict(counters["graph_break"]) == {}
    # one graph for both groups (and the final norm's): not one per group
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_blocks_per_graph_is_refused_where_blocks_cannot_share_a_graph(caplog):
    kw = {"num_blocks": 8}
    assert blocks_per_graph(4, scope="blocks", fsdp_wrap="root", layer_types=["full_attention"] * 8, **kw) == 4
    assert blocks_per_graph(4, scope="blocks", fsdp_wrap="none", layer_types=None, **kw) == 4  # no FSDP hooks at all
    caplog.set_level("INFO")
    assert blocks_per_graph(4, scope="pointwise", fsdp_wrap="root", layer_types=None, **kw) == 1
    assert blocks_per_graph(4, scope="", fsdp_wrap="block", layer_types=None, **kw) == 1
    assert "compile_blocks_per_graph=4 has no effect: nothing is compiled" in caplog.text
    with pytest.raises(EngineError, match="needs the model as one FSDP unit or no FSDP .*it resolved to block"):
        blocks_per_graph(2, scope="blocks", fsdp_wrap="block", layer_types=None, **kw)
    with pytest.raises(EngineError, match="mixes layer types .full_attention, sliding_attention"):
        blocks_per_graph(2, scope="blocks", fsdp_wrap="root", layer_types=["sliding_attention", "full_attention"], **kw)
    with pytest.raises(EngineError, match="auto or an integer >= 1, got 0"):
        blocks_per_graph(0, scope="blocks", fsdp_wrap="root", layer_types=None, **kw)
    with pytest.raises(EngineError, match="auto or an integer >= 1, got 'eight'"):
        blocks_per_graph("eight", scope="blocks", fsdp_wrap="root", layer_types=None, **kw)


@pytest.mark.parametrize(("num_blocks", "want"), [(24, 8), (28, 7), (32, 8), (36, 6), (2, 2), (1, 1), (13, 1)])
def test_auto_blocks_per_graph_divides_the_blocks_evenly(num_blocks: int, want: int) -> None:
    """``auto``: every group the same size (one graph to compile), at most AUTO_BLOCKS_PER_GRAPH."""
    assert AUTO_BLOCKS_PER_GRAPH == 8
    assert blocks_per_graph("auto", scope="blocks", fsdp_wrap="none", layer_types=None, num_blocks=num_blocks) == want
    assert (
        blocks_per_graph(
            "auto", scope="blocks", fsdp_wrap="root", layer_types=["full_attention"] * num_blocks, num_blocks=num_blocks
        )
        == want
    )


def test_auto_blocks_per_graph_is_one_where_blocks_cannot_share_a_graph() -> None:
    """Where a number > 1 would be refused, ``auto`` quietly runs one block a graph."""
    assert blocks_per_graph("auto", scope="blocks", fsdp_wrap="block", layer_types=None, num_blocks=24) == 1
    assert blocks_per_graph("auto", scope="pointwise", fsdp_wrap="none", layer_types=None, num_blocks=24) == 1
    assert blocks_per_graph("auto", scope="", fsdp_wrap="root", layer_types=None, num_blocks=24) == 1
    mixed = ["sliding_attention", "full_attention"] * 12
    assert blocks_per_graph("auto", scope="blocks", fsdp_wrap="root", layer_types=mixed, num_blocks=24) == 1


class _Heads(torch.nn.Module):
    """A stand-in attention: reshapes by its ``head_dim``, as transformers' attentions do."""

    def __init__(self, head_dim: int, static: bool) -> None:
        super().__init__()
        self.head_dim, self.static = head_dim, static

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from areal_tasks.kernels.attention import _static_head_dim

        if self.static:
            _static_head_dim(self)
        return x.view(x.shape[0], -1, self.head_dim) * 2


@pytest.mark.parametrize("static", [True, False])
def test_compiled_attention_makes_head_dim_a_constant(static):
    """Blocks compile with module ints symbolic (one graph for every layer_idx); the attention then
    pins ``head_dim`` to its value, so the graph's index arithmetic has no run-time divisor: a new
    head_dim needs a new graph. Without it (the control) one symbolic graph serves both."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    module = _Heads(8, static)
    compiled = torch.compile(module, backend=counter, dynamic=True)
    x = torch.randn(3, 32)
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
        torch.testing.assert_close(compiled(x), x.view(3, -1, 8) * 2)
        module.head_dim = 4
        torch.testing.assert_close(compiled(x), x.view(3, -1, 4) * 2)
    assert counter.frame_count == (2 if static else 1)
