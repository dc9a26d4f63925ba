"""The chunked fused LM head equals the plain full-logits path: log-probs, entropies and the
gradients with respect to the hidden states, the head weight and bias, for ragged chunkings and a
temperature; and the model-level swap keeps ties, state-dict keys and plain-linear behaviour."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.errors import EngineError
from areal_tasks.kernels.lm_head import (
    ChunkedLMHead,
    chunked_next_token_stats,
    default_chunk_size,
    install_chunked_head,
)
from areal_tasks.kernels.logprobs import next_token_stats

N, H, V = 23, 8, 37


def _inputs(seed: int = 0, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64).float().requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 0.7).requires_grad_()
    b = (torch.randn(V, generator=gen) * 0.3).requires_grad_() if bias else None
    labels = torch.randint(0, V, (N,), generator=gen)
    up_lp, up_ent = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    return hidden, weight, b, labels, up_lp, up_ent


def _grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("chunk", [1, 5, 7, 23, 64])  # ragged last chunk, one chunk, chunk > N
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_head_equals_full_logits(chunk, temperature, entropy_grad, bias):
    hidden, weight, b, labels, up_lp, up_ent = _inputs(bias=bias)
    params = (hidden, weight, b)

    logits = torch.nn.functional.linear(hidden, weight, b)
    ref_lp, ref_ent = next_token_stats(logits, labels, temperature=temperature, with_entropy=True)
    ref_loss = (ref_lp * up_lp).sum() + ((ref_ent if entropy_grad else ref_ent.detach()) * up_ent).sum()
    ref_grads = _grads(ref_loss, params)

    lp, ent = chunked_next_token_stats(
        hidden,
        weight,
        labels,
        bias=b,
        temperature=temperature,
        with_entropy=True,
        entropy_grad=entropy_grad,
        chunk=chunk,
    )
    assert ent.requires_grad == entropy_grad
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    loss = (lp * up_lp).sum() + (ent * up_ent).sum()
    # gradients sum over tokens: chunked and full sums round differently in float32, on some CPUs by
    # more than 1e-5 (one bias-gradient element of 0.23 off by 1.5e-5); a mistake in the maths would
    # be off by orders of magnitude more
    for got, want in zip(_grads(loss, params), ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=2e-4)


def test_entropy_only_gradient_and_logprob_only_output():
    hidden, weight, _, labels, _, up_ent = _inputs(seed=1)
    logits = hidden @ weight.t()
    _, ref_ent = next_token_stats(logits, labels, temperature=1.3, with_entropy=True)
    ref = _grads((ref_ent * up_ent).sum(), (hidden, weight))
    _, ent = chunked_next_token_stats(
        hidden, weight, labels, temperature=1.3, with_entropy=True, entropy_grad=True, chunk=6
    )
    for got, want in zip(_grads((ent * up_ent).sum(), (hidden, weight)), ref):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    lp, none = chunked_next_token_stats(hidden, weight, labels, chunk=4)
    assert none is None and lp.shape == (N,)


def test_frozen_weight_gets_no_gradient_and_no_grad_mode_works():
    hidden, weight, _, labels, up_lp, _ = _inputs(seed=2)
    weight.requires_grad_(False)
    lp, _ = chunked_next_token_stats(hidden, weight, labels, chunk=5)
    (g_h,) = torch.autograd.grad((lp * up_lp).sum(), [hidden])
    ref_lp, _ = next_token_stats(hidden @ weight.t(), labels)
    torch.testing.assert_close(g_h, torch.autograd.grad((ref_lp * up_lp).sum(), [hidden])[0], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        lp2, _ = chunked_next_token_stats(hidden, weight, labels, chunk=5)
    assert not lp2.requires_grad
    torch.testing.assert_close(lp2, ref_lp.detach(), atol=1e-5, rtol=1e-5)


def test_bf16_close_to_fp32():
    hidden, weight, _, labels, up_lp, _ = _inputs(seed=3)
    h16, w16 = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    lp16, _ = chunked_next_token_stats(h16, w16, labels, chunk=6)
    ref16, _ = next_token_stats(torch.nn.functional.linear(h16, w16), labels)
    torch.testing.assert_close(lp16, ref16, atol=1e-5, rtol=1e-5)  # same bf16 logits, fp32 scoring
    g = torch.autograd.grad((lp16 * up_lp).sum(), [h16, w16])
    g_ref = torch.autograd.grad((ref16 * up_lp).sum(), [h16, w16])
    assert g[0].dtype == torch.bfloat16 and g[1].dtype == torch.bfloat16
    for got, want in zip(g, g_ref):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_bad_inputs_are_engine_errors():
    hidden, weight, _, labels, _, _ = _inputs()
    with pytest.raises(EngineError, match="labels"):
        chunked_next_token_stats(hidden, weight, labels[:-1])
    with pytest.raises(EngineError, match="temperature"):
        chunked_next_token_stats(hidden, weight, labels, temperature=0.0)
    with pytest.raises(EngineError, match="weight"):
        chunked_next_token_stats(hidden, weight[:, :-1], labels)


def test_default_chunk_size():
    assert default_chunk_size(151936) == 832  # 2**27 elements / vocab, a multiple of 64
    assert default_chunk_size(1024) == 131072 and default_chunk_size(10**9) == 64


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_installed_head_in_a_model(family, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    from areal_tasks.engine.microbatch import position_ids_from_cu_seqlens

    path = str(tiny_model_factory(family))
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    keys = list(model.state_dict())
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    head = install_chunked_head(model, chunk=4)
    assert isinstance(head, ChunkedLMHead) and list(model.state_dict()) == keys
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    assert install_chunked_head(model) is head  # idempotent
    cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    ids = torch.randint(0, 500, (1, 15), generator=torch.Generator().manual_seed(0))
    pos = position_ids_from_cu_seqlens(cu)[None]
    labels = torch.roll(ids[0], -1)
    logits = ref(input_ids=ids, position_ids=pos).logits
    torch.testing.assert_close(model(input_ids=ids, position_ids=pos).logits, logits)  # plain outside scoring
    with head.scoring(labels, temperature=0.8, with_entropy=True):
        stats = model(input_ids=ids, position_ids=pos).logits
    assert stats.shape == (1, 15, 2) and stats.dtype == torch.float32
    want_lp, want_ent = next_token_stats(logits[0], labels, temperature=0.8, with_entropy=True)
    torch.testing.assert_close(stats[0, :, 0], want_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats[0, :, 1], want_ent, atol=1e-5, rtol=1e-5)
    (stats[0, :, 0].sum()).backward()
    (next_token_stats(logits[0], labels, temperature=0.8)[0].sum()).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_unsupported_models_keep_the_plain_head(tiny_model_factory):
    from transformers import AutoModelForCausalLM

    from areal_tasks.kernels.lm_head import chunked_head_unsupported_reason

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory("qwen2")))
    assert "LoRA" in chunked_head_unsupported_reason(model, ["q_proj", "lm_head"])
    assert install_chunked_head(model, lora_targets="lm_head") is None
    model.config.model_type = "gemma2"
    assert "gemma2" in chunked_head_unsupported_reason(model)


def _counting_linear(monkeypatch) -> list[int]:
    """Count the head's recomputing matmuls (``F.linear`` calls)."""
    calls: list[int] = []
    linear = torch.nn.functional.linear

    def counted(*args, **kwargs):
        calls.append(1)
        return linear(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", counted)
    return calls


@pytest.mark.parametrize("bias", [False, True])
def test_kept_logits_give_the_same_results_without_recomputing_them(bias, monkeypatch):
    """``keep_logits``: the backward reads the forward's logits (no matmul recomputes them) and
    every result and gradient is what the recomputing head gives."""
    hidden, weight, b, labels, up_lp, up_ent = _inputs(seed=4, bias=bias)
    params = (hidden, weight, b)
    lp, ent = chunked_next_token_stats(
        hidden, weight, labels, bias=b, temperature=0.9, with_entropy=True, entropy_grad=True, chunk=5
    )
    want = _grads((lp * up_lp).sum() + (ent * up_ent).sum(), params)
    calls = _counting_linear(monkeypatch)
    kept_lp, kept_ent = chunked_next_token_stats(
        hidden, weight, labels, bias=b, temperature=0.9, with_entropy=True, entropy_grad=True, chunk=5, keep_logits=True
    )
    assert not calls  # the forward writes the logits into the kept buffer
    got = _grads((kept_lp * up_lp).sum() + (kept_ent * up_ent).sum(), params)
    assert not calls  # and the backward reads them
    torch.testing.assert_close(kept_lp, lp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kept_ent, ent, atol=1e-6, rtol=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_kept_logits_are_consumed_by_their_backward():
    """The backward writes the gradient over the kept logits: a second backward through the same
    graph raises (autograd's version check) instead of reading gradients as logits."""
    hidden, weight, _, labels, up_lp, _ = _inputs(seed=6)
    lp, _ = chunked_next_token_stats(hidden, weight, labels, chunk=5, keep_logits=True)
    loss = (lp * up_lp).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_kept_logits_only_when_a_backward_will_read_them(monkeypatch):
    """Without gradients nothing is kept: the chunks are scored as usual (the plain matmul path)."""
    hidden, weight, _, labels, _, _ = _inputs(seed=5)
    calls = _counting_linear(monkeypatch)
    with torch.no_grad():
        lp, _ = chunked_next_token_stats(hidden, weight, labels, chunk=5, keep_logits=True)
    assert len(calls) == -(-N // 5)
    ref, _ = next_token_stats(hidden.detach() @ weight.detach().t(), labels)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)


def test_the_head_module_passes_keep_logits_on(monkeypatch):
    linear = torch.nn.Linear(H, V, bias=False)
    head = ChunkedLMHead(linear, chunk=4, keep_logits=True)
    assert "keep_logits=True" in repr(head)
    hidden = torch.randn(1, N, H, requires_grad=True)
    labels = torch.randint(0, V, (1, N))
    calls = _counting_linear(monkeypatch)
    with head.scoring(labels):
        scores = head(hidden)
    scores[..., 0].sum().backward()
    assert not calls and hidden.grad is not None
