"""The ``transformers`` reference of the inference throughput benchmark (``inference_throughput.py``):
``generate`` on the same model (greedy, EOS ignored), and the greedy parity of the engine's outputs
with it: identical outputs, matching leading tokens, and the reference's logit gap at each first
divergence.
"""

from __future__ import annotations

import time

import torch


def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=model.device)
    with torch.no_grad():
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        if model.device.type == "cuda":
            torch.cuda.synchronize()
    return time.perf_counter() - start, out[:, ids.shape[1] :].tolist()


@torch.inference_mode()
def divergence_gaps(model, prompts: list[list[int]], got: list[list[int]], want: list[list[int]]) -> list[float]:
    """For each output that differs from ``generate``'s: at the first differing position, the
    reference model's logit of its own token minus its logit of the engine's token, given the shared
    prefix. A gap within the dtype's rounding (bf16: about 1e-2 at these logit sizes) is a near-tie
    that batched kernels may break either way, not a wrong token."""
    gaps = []
    for prompt, a, b in zip(prompts, got, want):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None:
            continue
        ids = torch.tensor([prompt + b[:first]], device=model.device)
        logits = model(input_ids=ids).logits[0, -1].float()
        gaps.append(float(logits[b[first]] - logits[a[first]]))
    return gaps


def parity(got: list[list[int]], want: list[list[int]]) -> tuple[int, float]:
    """(token-identical outputs, mean fraction of matching leading tokens)."""
    fractions = []
    for a, b in zip(got, want):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fractions.append(same / max(len(b), 1))
    return sum(f == 1.0 for f in fractions), sum(fractions) / max(len(fractions), 1)
