"""The memory estimator against ``torch.cuda.max_memory_allocated`` on a real training step.

A transformers Qwen2 model built from a small config trains on CUDA with AdamW: two packed
micro-batches of N tokens each (gradient accumulation), block-diagonal causal attention through a
per-sequence SDPA attention function (no pad token, no T x T mask), log-probabilities by an fp32
log-softmax over the full vocabulary (the unchunked CE the estimate assumes). A warm-up step
allocates the optimizer state; the peak of the second step must lie within 25% of the estimate.

Run standalone on a GPU machine: ``python -m pytest tests/gpu/test_memory_estimate_gpu.py -s``
(with the repository root importable, e.g. ``PYTHONPATH=.``); ``-s`` prints the figures.
"""

from __future__ import annotations

import itertools
import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from areal_tasks.engine.microbatch import position_ids_from_cu_seqlens  # noqa: E402
from areal_tasks.models.memory import estimate_memory  # noqa: E402

pytestmark = pytest.mark.gpu

ATTENTION = "areal_packed_sdpa"
TOLERANCE = 0.25

SMALL_VOCAB = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
BIG_VOCAB = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 4,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}
FP32_MHA = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
}

CASES = [
    pytest.param(BIG_VOCAB, "bfloat16", "adamw_pure", False, 8192, id="bf16-vocab152k"),
    pytest.param(SMALL_VOCAB, "bfloat16", "adamw_pure", False, 8192, id="bf16-16layers"),
    pytest.param(SMALL_VOCAB, "bfloat16", "adamw_pure", True, 16384, id="bf16-16layers-ckpt"),
    pytest.param(FP32_MHA, "float32", "adamw", False, 4096, id="fp32-adamw"),
]


def _packed_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal attention within each packed sequence: one SDPA call per ``cu_seq_lens_q`` span."""
    bounds = kwargs["cu_seq_lens_q"].tolist()
    gqa = query.shape[1] != key.shape[1]
    pieces = [
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True, scale=scaling, enable_gqa=gqa
        )
        for s, e in itertools.pairwise(bounds)
    ]
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None


def _packed_batch(n_tokens: int, vocab: int, seed: int) -> dict:
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < n_tokens:
        lengths.append(min(rng.randint(256, 2048), n_tokens - sum(lengths)))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ids = torch.randint(0, vocab, (n_tokens,), generator=torch.Generator().manual_seed(seed)).cuda()
    mask = torch.ones(n_tokens, device="cuda")
    mask[cu[:-1].long()] = 0
    return {"input_ids": ids, "cu_seqlens": cu, "loss_mask": mask, "max_len": max(lengths)}


def _loss(model, batch: dict) -> torch.Tensor:
    cu = batch["cu_seqlens"]
    logits = model(
        input_ids=batch["input_ids"][None],
        position_ids=position_ids_from_cu_seqlens(cu)[None],
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=batch["max_len"],
        max_length_k=batch["max_len"],
        use_cache=False,
    ).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    # token t is predicted by position t-1; positions at sequence starts are masked out.
    token_logprobs = logprobs[:-1].gather(-1, batch["input_ids"][1:, None]).squeeze(-1)
    mask = batch["loss_mask"][1:]
    return -(token_logprobs * mask).sum() / mask.sum()


def _train_step(model, optim, batches: list[dict]) -> None:
    """One optimizer step over ``batches`` (gradients accumulated across them)."""
    for batch in batches:
        _loss(model, batch).backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


@pytest.mark.parametrize(("dims", "dtype", "optimizer", "checkpointing", "n_tokens"), CASES)
def test_peak_memory_within_25_percent(dims, dtype, optimizer, checkpointing, n_tokens):
    transformers.AttentionInterface.register(ATTENTION, _packed_sdpa)
    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register(ATTENTION, _no_mask)
    config = transformers.Qwen2Config(**dims, tie_word_embeddings=False, max_position_embeddings=32768)
    torch_dtype = getattr(torch, dtype)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION, dtype=torch_dtype)
    model = model.cuda().train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batches = [_packed_batch(n_tokens, config.vocab_size, seed) for seed in range(2)]

    _train_step(model, optim, batches)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    _train_step(model, optim, batches)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - before

    estimate = estimate_memory(config, param_dtype=dtype, optimizer=optimizer, gradient_checkpointing=checkpointing)
    predicted = estimate.total_bytes(n_tokens)
    static_measured = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        f"\n{dtype} {optimizer} ckpt={checkpointing} N={n_tokens}: measured {measured / 2**30:.2f} GiB, "
        f"estimated {predicted / 2**30:.2f} GiB (ratio {predicted / measured:.3f}); params "
        f"{estimate.param_bytes / 2**30:.3f} (real {static_measured / 2**30:.3f}) GiB, "
        f"{estimate.bytes_per_token / 2**10:.1f} KiB/token of which logits "
        f"{estimate.logits_bytes_per_token / 2**10:.1f}"
    )
    del model, optim, batches
    torch.cuda.empty_cache()
    assert estimate.param_bytes == static_measured
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)
