"""The archon decoder against transformers on every supported family: per-token log-probs and
entropies of a packed batch, and the gradient of a loss (with the MoE auxiliary loss) w.r.t. every
parameter, fp32 on CPU."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.model import build_decoder, moe_aux_loss
from areal_tasks.engine.archon.model.hf_io import hf_to_archon

MOE = ("qwen2_moe", "qwen3_moe", "mixtral")
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", *MOE)
TEMPERATURE = 0.7
AUX_COEF = 0.1


def _hf_grads(model: torch.nn.Module, args) -> dict[str, torch.Tensor]:
    """transformers' gradients under archon names (through the on-disk names and hf_io)."""
    from transformers.core_model_loading import revert_weight_conversion

    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return hf_to_archon(revert_weight_conversion(model, grads), args)


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_entropy_and_grads_match_transformers(family, tiny_model_factory, packed, hf_causal_lm, hf_reference):
    model_dir = tiny_model_factory(family)
    model, args = build_decoder(model_dir)
    hf = hf_causal_lm(model_dir)
    batch = packed()
    keep = batch.scored()

    out = model(
        batch.input_ids,
        position_ids=batch.position_ids,
        cu_seqlens=batch.cu_seqlens,
        bounds=batch.bounds,
        labels=batch.labels,
        temperature=TEMPERATURE,
    )
    moe = family in MOE
    out, aux = out if moe else (out, None)
    assert out.shape == (1, batch.input_ids.shape[1], 2) and out.dtype == torch.float32
    ref, hf_outs = hf_reference(hf, batch, TEMPERATURE, output_router_logits=moe)
    torch.testing.assert_close(out[0, keep], ref, atol=1e-5, rtol=1e-5)

    weights = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    loss = (out[0, keep] * weights).sum()
    ref_loss = (ref * weights).sum()
    if moe:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func

        n_tokens = batch.input_ids.shape[1]
        loss = loss + AUX_COEF * moe_aux_loss(aux, args.n_moe_layers * n_tokens, args.n_experts)
        per_layer = tuple(torch.cat(layer) for layer in zip(*(o.router_logits for o in hf_outs)))
        ref_loss = ref_loss + AUX_COEF * load_balancing_loss_func(per_layer, args.n_experts, args.top_k)
    loss.backward()
    ref_loss.backward()

    expected = _hf_grads(hf, args)
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert set(grads) == set(expected)
    for name, grad in grads.items():
        assert grad is not None, name
        torch.testing.assert_close(grad, expected[name], atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_hidden_and_logits_outputs(tiny_model_factory, packed, hf_causal_lm):
    """Without labels the actor returns logits; without a head, hidden states; without the embedding,
    hidden states go in."""
    model_dir = tiny_model_factory("qwen2")
    model, _ = build_decoder(model_dir)
    batch = packed()
    kwargs = {"position_ids": batch.position_ids, "cu_seqlens": batch.cu_seqlens, "bounds": batch.bounds}
    logits = model(batch.input_ids, **kwargs)
    seq = batch.sequences()[1]
    ref = hf_causal_lm(model_dir)(input_ids=seq[None]).logits
    torch.testing.assert_close(logits[:, batch.bounds[1] : batch.bounds[2]], ref, atol=1e-5, rtol=1e-5)

    embed, head, norm = model.embed_tokens, model.lm_head, model.norm
    model.lm_head = model.norm = None
    hidden = model(batch.input_ids, **kwargs)
    assert hidden.shape == (1, batch.input_ids.shape[1], model.args.hidden_size)
    model.embed_tokens, model.lm_head, model.norm = None, head, norm
    torch.testing.assert_close(model(embed(batch.input_ids), **kwargs), logits)


def test_without_bounds_reads_cu_seqlens(tiny_model_factory, packed):
    model, _ = build_decoder(tiny_model_factory("llama"))
    batch = packed()
    kwargs = {"position_ids": batch.position_ids, "cu_seqlens": batch.cu_seqlens, "labels": batch.labels}
    torch.testing.assert_close(model(batch.input_ids, **kwargs), model(batch.input_ids, bounds=batch.bounds, **kwargs))
