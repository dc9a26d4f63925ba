"""Packed forward: per-token log-probs/entropy of packed sequences equal those of each sequence run
alone (transformers detects the packing from the position ids), in the batch layout's alignment."""

from __future__ import annotations

import itertools

import pytest
import torch

from areal_tasks.engine.fsdp.forward import ForwardSpec, MicroBatchForward
from areal_tasks.engine.microbatch import position_ids_from_cu_seqlens
from areal_tasks.kernels.logprobs import align_to_tokens, next_token_labels, next_token_stats


def _packed(seed: int = 0, lengths=(5, 1, 9, 3, 12)) -> dict:
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lengths), 0).tolist()], dtype=torch.int32)
    ids = torch.randint(0, 500, (int(cu[-1]),), generator=gen)
    return {"input_ids": ids, "cu_seqlens": cu, "position_ids": position_ids_from_cu_seqlens(cu)}


def _unpacked(model, mb, temperature=1.0):
    lps, ents = [], []
    cu = mb["cu_seqlens"].tolist()
    for a, b in itertools.pairwise(cu):
        ids = mb["input_ids"][a:b]
        logits = model(input_ids=ids[None]).logits[0, :-1].float() / temperature
        logp = torch.log_softmax(logits, -1)
        lps.append(torch.cat([torch.zeros(1), logp.gather(-1, ids[1:, None]).squeeze(-1)]))
        ents.append(torch.cat([torch.zeros(1), -(logp.exp() * logp).sum(-1)]))
    return torch.cat(lps), torch.cat(ents)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_packed_equals_unpacked(family, attn, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(family)), attn_implementation=attn)
    mb = _packed()
    with torch.no_grad():
        out = MicroBatchForward(model, ForwardSpec(role="actor", temperature=0.7), None)(mb, with_entropy=True)
        ref_lp, ref_ent = _unpacked(model, mb, temperature=0.7)
    torch.testing.assert_close(out["logprobs"], ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["entropy"], ref_ent, atol=1e-5, rtol=1e-5)
    assert out["logprobs"][mb["cu_seqlens"][:-1].long()].abs().max() == 0


def test_alignment_zeroes_sequence_starts_and_shifts():
    cu = torch.tensor([0, 2, 5])
    ids = torch.tensor([1, 2, 3, 4, 5])
    assert next_token_labels(ids).tolist() == [2, 3, 4, 5, 1]
    assert align_to_tokens(torch.tensor([10.0, 11, 12, 13, 14]), cu).tolist() == [0.0, 10.0, 0.0, 12.0, 13.0]


def test_next_token_stats_chunks_agree_with_a_direct_log_softmax(monkeypatch):
    import areal_tasks.kernels.logprobs as lp_mod

    monkeypatch.setattr(lp_mod, "_CHUNK", 3)
    logits = torch.randn(10, 7, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 7, (10,), generator=torch.Generator().manual_seed(2))
    lp, ent = next_token_stats(logits, labels, with_entropy=True)
    ref = torch.log_softmax(logits, -1)
    torch.testing.assert_close(lp, ref.gather(-1, labels[:, None]).squeeze(-1))
    torch.testing.assert_close(ent, -(ref.exp() * ref).sum(-1))


@pytest.mark.parametrize("grad_entropy", [False, True])
def test_chunked_head_forward_equals_full_logits_forward(grad_entropy, tiny_model_factory):
    """MicroBatchForward with the chunked fused head installed: same log-probs, entropies and
    parameter gradients as the full-logits path (temperature != 1, several chunks)."""
    from transformers import AutoModelForCausalLM

    from areal_tasks.kernels.lm_head import install_chunked_head

    path = str(tiny_model_factory("qwen2"))
    plain = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    fused = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    head = install_chunked_head(fused, chunk=7)
    spec = ForwardSpec(role="actor", temperature=0.7, grad_entropy=grad_entropy)
    mb = _packed(seed=3)
    adv = torch.randn(mb["input_ids"].shape[0], generator=torch.Generator().manual_seed(4))
    outs = []
    for model, lm_head in ((plain, None), (fused, head)):
        out = MicroBatchForward(model, spec, None, lm_head=lm_head)(
            mb, with_entropy=True, bounds=tuple(mb["cu_seqlens"].tolist())
        )
        loss = -(out["logprobs"] * adv).sum() - (0.1 * out["entropy"].sum() if grad_entropy else 0.0)
        loss.backward()
        outs.append(out)
    torch.testing.assert_close(outs[1]["logprobs"], outs[0]["logprobs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1]["entropy"], outs[0]["entropy"], atol=1e-5, rtol=1e-5)
    assert outs[1]["entropy"].requires_grad == grad_entropy
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
