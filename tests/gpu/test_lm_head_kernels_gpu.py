"""The LM head's Triton chunk kernels on a CUDA GPU (skipped without CUDA or Triton).

Each kernel against the pure function it replaces (``lm_head.chunk_forward_stats`` and
``chunk_logit_grad``, run eagerly in fp32 from the same logits): vocabularies below, at and off
the kernels' block size and Qwen2.5's 151,936; one row and many; a temperature; with and without
the entropy and each upstream gradient; logits far from zero, where the online maximum matters.
Then the whole chunked head with the kernels against the full-logits reference, gradients included.
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.kernels import lm_head
from areal_tasks.kernels.lm_head_kernels import GRAD_BLOCK, forward_stats, kernels_available, logit_grad

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not kernels_available(), reason="needs CUDA and triton")]


def logits_and_labels(
    rows: int, vocab: int, *, offset: float = 0.0, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3 + offset).to(dtype)
    labels = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    labels[-1] = vocab - 1  # the last column, in the last (partial) block
    return logits, labels


@pytest.mark.parametrize("vocab", [17, GRAD_BLOCK, GRAD_BLOCK + 3, 151936])
@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_forward_stats_match_the_pure_function(vocab: int, rows: int, temperature: float, with_entropy: bool) -> None:
    logits, labels = logits_and_labels(rows, vocab, seed=vocab + rows)
    got = forward_stats(logits, labels, temperature, with_entropy)
    want = lm_head.chunk_forward_stats(logits, labels, temperature, with_entropy)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)


def exact_stats(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> tuple[torch.Tensor, ...]:
    """log Z, the label's log-prob and the entropy in float64."""
    z = logits.double() / temperature
    log_z = torch.logsumexp(z, dim=-1)
    log_p = z - log_z[:, None]
    return log_z, log_p.gather(-1, labels[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def test_forward_stats_far_from_zero_and_fp32_logits() -> None:
    """Logits around +-80 overflow exp() without the running maximum, and an entropy taken as
    ``log Z - E[z]`` loses digits there; against float64. fp32 logits work too."""
    for offset in (80.0, -80.0):
        logits, labels = logits_and_labels(8, 70000, offset=offset)
        got = forward_stats(logits, labels, 1.0, True)
        for g, w in zip(got, exact_stats(logits, labels, 1.0)):
            assert torch.isfinite(g).all()
            torch.testing.assert_close(g.double(), w, atol=2e-5, rtol=1e-6)
    logits, labels = logits_and_labels(8, 5000, dtype=torch.float32)
    for g, w in zip(forward_stats(logits, labels, 0.9, True), exact_stats(logits, labels, 0.9)):
        torch.testing.assert_close(g.double(), w, atol=2e-5, rtol=1e-6)


@pytest.mark.parametrize("vocab", [17, GRAD_BLOCK + 3, 151936])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("upstream", ["both", "logprob", "entropy"])
def test_logit_grad_matches_the_pure_function(vocab: int, temperature: float, upstream: str) -> None:
    logits, labels = logits_and_labels(29, vocab, seed=vocab)
    log_z, _, entropy = lm_head.chunk_forward_stats(logits, labels, temperature, True)
    gen = torch.Generator(device="cuda").manual_seed(7)
    g_lp = torch.randn(29, device="cuda", generator=gen) if upstream in ("both", "logprob") else None
    g_ent = torch.randn(29, device="cuda", generator=gen) if upstream in ("both", "entropy") else None
    got = logit_grad(logits, labels, log_z, entropy, g_lp, g_ent, temperature)
    want = lm_head.chunk_logit_grad(logits, labels, log_z, entropy, g_lp, g_ent, temperature)
    assert got.dtype == logits.dtype and got.shape == logits.shape
    # both round an fp32 value to bf16 once; the fp32 values differ by exp()'s last bits
    torch.testing.assert_close(got.float(), want.float(), atol=1e-6, rtol=8e-3)


def test_logit_grad_takes_an_expanded_upstream_gradient() -> None:
    """The gradient of ``logprob.sum()`` reaches the head as a stride-0 expanded scalar."""
    logits, labels = logits_and_labels(40, 3000)
    log_z, _, entropy = lm_head.chunk_forward_stats(logits, labels, 1.0, True)
    ones = torch.ones((), device="cuda").expand(40)
    got = logit_grad(logits, labels, log_z, entropy, ones, ones * 0.5, 1.0)
    want = lm_head.chunk_logit_grad(logits, labels, log_z, entropy, ones.contiguous(), ones * 0.5, 1.0)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-6, rtol=8e-3)


def test_logit_grad_in_place_overwrites_the_logits_with_their_gradient() -> None:
    """The kept-logits backward writes the gradient over the logits: the same values as a new tensor."""
    from areal_tasks.errors import EngineError
    from areal_tasks.kernels.lm_head_kernels import logit_grad_in_place

    logits, labels = logits_and_labels(33, GRAD_BLOCK * 2 + 5, seed=11)
    log_z, _, entropy = lm_head.chunk_forward_stats(logits, labels, 0.8, True)
    g_lp = torch.randn(33, device="cuda")
    want = logit_grad(logits, labels, log_z, entropy, g_lp, None, 0.8)
    pointer = logits.data_ptr()
    got = logit_grad_in_place(logits, labels, log_z, entropy, g_lp, None, 0.8)
    assert got.data_ptr() == pointer
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    with pytest.raises(EngineError, match="out must be contiguous"):
        logit_grad(want, labels, log_z, entropy, g_lp, None, 0.8, out=want.float())


def test_logit_grad_without_upstream_is_zero() -> None:
    logits, labels = logits_and_labels(3, 100)
    log_z, _, entropy = lm_head.chunk_forward_stats(logits, labels, 1.0, True)
    assert not logit_grad(logits, labels, log_z, entropy, None, None, 1.0).any()


def test_kernels_refuse_strided_logits() -> None:
    from areal_tasks.errors import EngineError

    logits, labels = logits_and_labels(4, 64)
    with pytest.raises(EngineError, match="contiguous CUDA logits"):
        forward_stats(logits[:, :32], labels, 1.0, False)


@pytest.mark.parametrize("keep_logits", [False, True])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("plain_sum", [False, True])  # d/d logprob of logprob.sum(): an expanded scalar
def test_chunked_head_with_the_kernels_equals_full_logits(
    entropy_grad: bool, plain_sum: bool, keep_logits: bool, monkeypatch
) -> None:
    from areal_tasks.kernels.logprobs import next_token_stats

    for name in ("forward", "grad", "grad_in_place", "kind"):  # compile_chunk_kernels swaps them process-wide
        monkeypatch.setitem(lm_head._kernels, name, lm_head._kernels[name])
    assert lm_head.compile_chunk_kernels(triton=True) == "triton"
    gen = torch.Generator(device="cuda").manual_seed(3)
    n, hidden_size, vocab = 300, 64, 5003
    hidden = torch.randn(n, hidden_size, device="cuda", generator=gen).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device="cuda", generator=gen) * 0.3).requires_grad_()
    labels = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
    up_lp, up_ent = torch.randn(n, device="cuda", generator=gen), torch.randn(n, device="cuda", generator=gen)

    def logprob_term(logprob: torch.Tensor) -> torch.Tensor:
        return logprob.sum() if plain_sum else (logprob * up_lp).sum()

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 products on both sides
    ref_lp, ref_ent = next_token_stats(hidden @ weight.t(), labels, temperature=0.8, with_entropy=True)
    ref_loss = logprob_term(ref_lp) + ((ref_ent if entropy_grad else ref_ent.detach()) * up_ent).sum()
    ref = torch.autograd.grad(ref_loss, [hidden, weight])
    lp, ent = lm_head.chunked_next_token_stats(
        hidden,
        weight,
        labels,
        temperature=0.8,
        with_entropy=True,
        entropy_grad=entropy_grad,
        chunk=128,
        keep_logits=keep_logits,
    )
    got = torch.autograd.grad(logprob_term(lp) + (ent * up_ent).sum(), [hidden, weight])
    torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent, ref_ent, atol=1e-4, rtol=1e-4)
    for g, w in zip(got, ref):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-3)
