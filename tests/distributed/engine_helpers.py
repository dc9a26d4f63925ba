"""Shared pieces of the FSDP engine tests: packed batches, a token-mean loss, and the plain
single-process transformers reference (one sequence at a time, no packing, no sharding)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

#: tolerance of every fp32 equivalence check against the reference.
ATOL = 1e-5
RTOL = 1e-4


def make_batch(seed: int = 0, n_seqs: int = 8, vocab: int = 200, min_len: int = 3, max_len: int = 17) -> dict:
    """A packed batch with random tokens, advantages and a loss mask (first token of each sequence masked)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n_seqs,), generator=gen)
    cu = torch.zeros(n_seqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    total = int(cu[-1])
    mask = (torch.rand(total, generator=gen) > 0.3).to(torch.int32)
    mask[cu[:-1].long()] = 0
    return {
        "input_ids": torch.randint(0, vocab, (total,), generator=gen),
        "cu_seqlens": cu,
        "loss_mask": mask,
        "advantages": torch.randn(total, generator=gen),
    }


def token_mean_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    """``-mean(logprob * advantage)`` over the micro-batch's masked tokens (0 when it has none)."""
    mask = mb["loss_mask"].float()
    denom = mask.sum().clamp(min=1.0)
    loss = -(outputs["logprobs"] * mb["advantages"] * mask).sum() / denom
    stats = {"mean_logprob": (outputs["logprobs"].detach() * mask).sum() / denom}
    if "entropy" in outputs:
        stats["entropy"] = (outputs["entropy"].detach() * mask).sum() / denom
    return loss, stats


def token_weight(mb: dict) -> float:
    return float(mb["loss_mask"].sum())


def value_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    """Squared error of the values against the advantages (as returns) over masked tokens."""
    mask = mb["loss_mask"].float()
    loss = (((outputs["values"] - mb["advantages"]) ** 2) * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {}


def sequences(batch: dict) -> list[torch.Tensor]:
    cu = batch["cu_seqlens"].tolist()
    return [batch["input_ids"][a:b] for a, b in itertools.pairwise(cu)]


def reference_logprobs(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Aligned per-token log-probs, one unpacked sequence at a time (differentiable)."""
    out = []
    for ids in sequences(batch):
        logits = model(input_ids=ids[None]).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None]).squeeze(-1)
        out.append(torch.cat([lp.new_zeros(1), lp]))
    return torch.cat(out)


def reference_grads(model_dir: Path, batch: dict) -> tuple[float, dict[str, torch.Tensor], torch.nn.Module]:
    """(loss, grads by name, model) of the whole batch's token-mean loss in one plain fp32 model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    lp = reference_logprobs(model, batch)
    loss, _ = token_mean_loss({"logprobs": lp}, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, model


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest element difference over tensors of the same names (and the name where it occurs)."""
    assert set(a) == set(b), f"names differ: {sorted(set(a) ^ set(b))}"
    worst = max(a, key=lambda n: float((a[n].float() - b[n].float()).abs().max()))
    return float((a[worst].float() - b[worst].float()).abs().max()), worst


def assert_family_results_match_reference(results_dir: Path, model_dirs: dict[str, str]) -> None:
    """Check each ``<family>.pt`` written by ``workers_fsdp:family_grads`` against the single-process
    reference: loss, every gradient, the global grad norm and the forward log-probs (fp32)."""
    import pytest

    batch = make_batch(seed=0)
    for family, model_dir in model_dirs.items():
        result = torch.load(results_dir / f"{family}.pt", weights_only=False)
        loss, grads, model = reference_grads(model_dir, batch)
        assert result["stats"]["loss"] == pytest.approx(loss, abs=ATOL), family
        diff, name = max_abs_diff(result["grads"], grads)
        assert diff < ATOL, f"{family}: gradient of {name} differs by {diff}"
        ref_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
        assert result["norm"] == pytest.approx(float(ref_norm), rel=RTOL), f"{family}: global grad norm"
        with torch.no_grad():
            torch.testing.assert_close(
                result["forward"]["logprobs"], reference_logprobs(model, batch), atol=ATOL, rtol=RTOL
            )
