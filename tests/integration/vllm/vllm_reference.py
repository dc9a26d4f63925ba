"""Transformers references for the vLLM tests: what a tiny model itself says about given tokens.

:func:`check_against_model` teacher-forces ``prompt + output`` through the HF model and checks every
output token: its logprob (at the sampling temperature) must match the server's, and for greedy
decoding the token must be the model's argmax. Random tiny models have nearly flat distributions,
so "argmax" allows ties within ``tie_tol`` of the best logit: two kernels may order near-equal
logits differently, but a token from the wrong weights is far off.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import torch

LOGPROB_TOL = 1e-3
TIE_TOL = 1e-4


@functools.lru_cache(maxsize=4)
def _model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def output_logprobs(
    model_dir: Path, prompt: Sequence[int], output: Sequence[int], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [T, V], logits [T, V])`` of the model at each output position (T = len(output))."""
    ids = torch.tensor([list(prompt) + list(output)])
    with torch.no_grad():
        logits = _model(str(model_dir))(ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, dim=-1), logits


def check_against_model(
    model_dir: Path,
    prompt: Sequence[int],
    output: Sequence[int],
    logprobs: Sequence[float],
    *,
    temperature: float = 0.0,
    greedy: bool = True,
) -> None:
    """Assert that ``output`` (with ``logprobs``) is what the model at ``model_dir`` produces."""
    assert len(output) == len(logprobs) > 0
    ref, logits = output_logprobs(model_dir, prompt, output, temperature)
    chosen = torch.tensor(list(output))
    ref_chosen = ref.gather(1, chosen.view(-1, 1)).view(-1)
    assert torch.allclose(ref_chosen, torch.tensor(list(logprobs)), atol=LOGPROB_TOL), (
        f"logprobs differ from {model_dir.name}: max |diff| "
        f"{(ref_chosen - torch.tensor(list(logprobs))).abs().max().item():.2e}"
    )
    if greedy:
        gap = logits.max(dim=-1).values - logits.gather(1, chosen.view(-1, 1)).view(-1)
        assert bool((gap <= TIE_TOL).all()), f"tokens are not {model_dir.name}'s greedy choice: gaps {gap.tolist()}"
