"""The archon MoE block: routing as transformers routes per family, the load-balancing statistics
against transformers' ``load_balancing_loss_func`` (with padding), the dispatcher and the expert
kernels (loop vs ``torch._grouped_mm``)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.model import build_decoder, moe_aux_loss
from areal_tasks.engine.archon.model.experts import GroupedExperts, LocalDispatcher, experts_forward
from areal_tasks.engine.archon.model.moe import MoE, route
from areal_tasks.errors import EngineError

MOE = ("qwen2_moe", "qwen3_moe", "mixtral")


def _cpu_grouped_mm() -> bool:
    """Whether this torch runs ``torch._grouped_mm`` in fp32 on the CPU (recent ones do)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        torch._grouped_mm(torch.ones(4, 8), torch.ones(2, 8, 8), offs=torch.tensor([0, 4], dtype=torch.int32))
    except (RuntimeError, NotImplementedError):
        return False
    return True


@pytest.mark.parametrize("family", MOE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_matches_transformers(family, dtype, tiny_model_factory, hf_causal_lm):
    model_dir = tiny_model_factory(family)
    model, _ = build_decoder(model_dir, dtype=dtype)
    hf_router = hf_causal_lm(model_dir, dtype).model.layers[0].mlp.gate
    moe = model.layers["0"].mlp
    x = torch.randn(37, model.args.hidden_size, generator=torch.Generator().manual_seed(0)).to(dtype)
    ref_logits, ref_weight, ref_index = hf_router(x)
    logits = moe.router_logits(x)
    _, weight, index = route(logits, moe.top_k, norm_topk_prob=moe.norm_topk_prob, weights_fp32=moe.weights_fp32)
    torch.testing.assert_close(logits, ref_logits, atol=0, rtol=0)
    torch.testing.assert_close(index, ref_index, atol=0, rtol=0)
    assert weight.dtype == ref_weight.dtype
    torch.testing.assert_close(weight, ref_weight, atol=0, rtol=0)


@pytest.mark.parametrize("family", MOE)
def test_aux_statistics_give_transformers_load_balancing_loss(family, tiny_model_factory, packed, hf_reference):
    from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func

    model, args = build_decoder(tiny_model_factory(family))
    batch = packed()
    logits: list[torch.Tensor] = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda _m, _i, out: logits.append(out.detach()))
        for layer in model.layers.values()
        if args.is_moe_layer(layer.layer_id)
    ]
    kwargs = {"position_ids": batch.position_ids, "cu_seqlens": batch.cu_seqlens, "bounds": batch.bounds}
    n_tokens = batch.input_ids.shape[1]
    mask = torch.ones(1, n_tokens, dtype=torch.bool)
    mask[0, -4:] = False  # padding a pipeline would add
    mask[0, 2] = False
    _, aux = model(batch.input_ids, **kwargs)
    _, aux_masked = model(batch.input_ids, token_mask=mask, **kwargs)
    for h in hooks:
        h.remove()
    assert aux.shape == (2, args.n_experts) and aux.dtype == torch.float32
    router = model.layers["0"].mlp.gate.weight
    (count_grad,) = torch.autograd.grad(aux[0].sum(), router, retain_graph=True, allow_unused=True)
    assert count_grad is None or not count_grad.any()  # the counts carry no gradient
    assert torch.autograd.grad(aux[1].square().sum(), router, retain_graph=True)[0].any()
    per_layer = tuple(logits[: len(hooks)])
    expected = load_balancing_loss_func(per_layer, args.n_experts, args.top_k)
    got = moe_aux_loss(aux, args.n_moe_layers * n_tokens, args.n_experts)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    expected = load_balancing_loss_func(per_layer, args.n_experts, args.top_k, attention_mask=mask.int())
    got = moe_aux_loss(aux_masked, args.n_moe_layers * int(mask.sum()), args.n_experts)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert aux[0].sum() == args.n_moe_layers * n_tokens * args.top_k

    # the router logits are transformers' (run one sequence at a time)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(family)), dtype=torch.float32).eval()
    _, outs = hf_reference(hf, batch, 1.0, output_router_logits=True)
    for i, layer_logits in enumerate(per_layer):
        torch.testing.assert_close(layer_logits, torch.cat([o.router_logits[i] for o in outs]), atol=1e-5, rtol=1e-5)

    # statistics carried in through ``aux`` are added to (a pipeline's later stage)
    _, carried = model(batch.input_ids, aux=aux.detach(), **kwargs)
    torch.testing.assert_close(carried, 2 * aux.detach())


def test_dense_model_has_no_aux(tiny_model_factory, packed):
    model, _ = build_decoder(tiny_model_factory("qwen3"))
    batch = packed()
    out = model(batch.input_ids, position_ids=batch.position_ids, cu_seqlens=batch.cu_seqlens, labels=batch.labels)
    assert isinstance(out, torch.Tensor)


def _naive_moe(x, index, weight, gate, up, down):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            h = torch.nn.functional.silu(gate[e] @ x[t]) * (up[e] @ x[t])
            out[t] += weight[t, j] * (down[e] @ h)
    return out


def test_local_dispatcher_matches_a_naive_moe():
    gen = torch.Generator().manual_seed(0)
    experts = GroupedExperts(5, 16, 24)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    x = torch.randn(13, 16, generator=gen)
    index = torch.randint(0, 5, (13, 2), generator=gen)
    index[:, 1] = (index[:, 0] + 1 + torch.randint(0, 4, (13,), generator=gen)) % 5  # distinct choices
    weight = torch.rand(13, 2, generator=gen)
    assert isinstance(experts.dispatcher, LocalDispatcher)
    got = experts(x, index, weight)
    expected = _naive_moe(x, index, weight, experts.gate_proj, experts.up_proj, experts.down_proj)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _kernel_case(dtype, device, counts=(7, 0, 33, 1, 20)):
    gen = torch.Generator().manual_seed(0)
    n_experts, dim, hidden = len(counts), 64, 32
    x = torch.randn(sum(counts), dim, generator=gen).to(device, dtype).requires_grad_()
    weights = [
        (torch.randn(shape, generator=gen) * 0.1).to(device, dtype).requires_grad_()
        for shape in ((n_experts, hidden, dim), (n_experts, hidden, dim), (n_experts, dim, hidden))
    ]
    return x, list(counts), weights


def _run(kernel, x, counts, weights, counts_as_tensor=False):
    c = torch.tensor(counts, device=x.device) if counts_as_tensor else counts
    y = experts_forward(x, c, *weights, kernel=kernel)
    grad_out = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device, y.dtype)
    grads = torch.autograd.grad(y, [x, *weights], grad_out)
    return y, grads


@pytest.mark.skipif(not _cpu_grouped_mm(), reason="this torch has no CPU torch._grouped_mm")
def test_grouped_mm_matches_loop_cpu():
    x, counts, weights = _kernel_case(torch.float32, "cpu")
    y_loop, g_loop = _run("loop", x, counts, weights)
    y_gmm, g_gmm = _run("grouped_mm", x, counts, weights, counts_as_tensor=True)
    torch.testing.assert_close(y_gmm, y_loop, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_gmm, g_loop):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_mm_matches_loop_cuda():
    """bf16, the case the kernel is for (tests/gpu/test_archon_model_gpu.py has more)."""
    x, counts, weights = _kernel_case(torch.bfloat16, "cuda")
    y_loop, g_loop = _run("loop", x, counts, weights)
    y_gmm, g_gmm = _run("grouped_mm", x, counts, weights, counts_as_tensor=True)
    torch.testing.assert_close(y_gmm, y_loop, atol=2e-2, rtol=2e-2)
    for a, b in zip(g_gmm, g_loop):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_unknown_kernel_is_refused():
    x, counts, weights = _kernel_case(torch.float32, "cpu")
    with pytest.raises(EngineError, match="unknown expert kernel"):
        experts_forward(x, counts, *weights, kernel="fast")


def test_moe_block_without_tokens():
    moe = MoE(16, 4, 2, 8, norm_topk_prob=True)
    y, stats = moe(torch.zeros(1, 0, 16))
    assert y.shape == (1, 0, 16) and torch.equal(stats, torch.zeros(2, 4))
