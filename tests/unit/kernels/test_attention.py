"""The packed attention behind Ulysses equals attention on each sequence alone, with GQA (fewer
key/value heads) and with a sliding window."""

from __future__ import annotations

import itertools

import pytest
import torch

from areal_tasks.kernels.attention import packed_attention


def _alone(q, k, v, bounds, window):
    outs = []
    rep = q.shape[1] // k.shape[1]
    for a, b in itertools.pairwise(bounds):
        i = torch.arange(b - a)
        mask = i[None, :] <= i[:, None]
        if window is not None:
            mask &= (i[:, None] - i[None, :]) < window
        scores = q[:, :, a:b] @ k[:, :, a:b].repeat_interleave(rep, 1).transpose(-1, -2) * 0.25
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        outs.append(probs @ v[:, :, a:b].repeat_interleave(rep, 1))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("kernel", ["per_sequence", "block_mask"])  # CPU's path, CUDA fp32's path
@pytest.mark.parametrize("window", [None, 3])
def test_packed_attention_matches_each_sequence_alone(window, kernel, monkeypatch):
    from areal_tasks.kernels import attention

    monkeypatch.setattr(attention, "packed_kernel", lambda *args, **kwargs: kernel)
    gen = torch.Generator().manual_seed(0)
    bounds = (0, 1, 6, 15, 19)
    q = torch.randn(1, 4, 19, 16, generator=gen)
    k, v = torch.randn(1, 2, 19, 16, generator=gen), torch.randn(1, 2, 19, 16, generator=gen)
    out = packed_attention(q, k, v, torch.tensor(bounds), bounds=bounds, scaling=0.25, sliding_window=window)
    torch.testing.assert_close(out, _alone(q, k, v, bounds, window), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ the varlen adapter (CPU stand-ins)
def _reference_varlen(q, k, v, cu, max_q, max_k, *, scale=None, window=(-1, 0), gqa=False):
    """What torch's varlen_attn computes, on ``[T, H, D]`` tensors, through the block mask."""
    from areal_tasks.kernels.attention import block_causal_mask, repeat_heads

    if not gqa:
        assert k.shape[1] == q.shape[1], "the adapter must repeat kv heads when enable_gqa is absent"
    rep = q.shape[1] // k.shape[1]
    qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    sliding = None if window[0] < 0 else window[0] + 1
    mask = block_causal_mask(cu, q.shape[0], sliding)
    out = torch.nn.functional.scaled_dot_product_attention(
        qb, repeat_heads(kb, rep), repeat_heads(vb, rep), attn_mask=mask, scale=scale
    )
    return out[0].transpose(0, 1)


def new_api(
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
):
    assert cu_seq_q.dtype == torch.int32 and isinstance(max_q, int)
    assert window_size[1] == 0, "the engine's attention is causal"
    return _reference_varlen(query, key, value, cu_seq_q, max_q, max_k, scale=scale, window=window_size, gqa=enable_gqa)


def old_api(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert is_causal
    return _reference_varlen(query, key, value, cu_seq_q, max_q, max_k)


def native_gqa(query, key, value, cu_seqlens, max_len, scale):
    """Stands in for ``flash_gqa.flash_varlen_gqa`` (torch's flash kernels need CUDA)."""
    assert cu_seqlens.dtype == torch.int32 and key.shape[1] < query.shape[1]
    return _reference_varlen(query, key, value, cu_seqlens, max_len, max_len, scale=scale, gqa=True)


@pytest.mark.parametrize("api", [new_api, old_api], ids=["torch>=2.11-style", "torch-2.10-style"])
@pytest.mark.parametrize("scaling", [None, 0.1])  # None: the default 1/sqrt(16) = 0.25
@pytest.mark.parametrize("window", [None, 3])
def test_varlen_adapter_matches_each_sequence_alone(api, scaling, window, monkeypatch):
    """``varlen_packed`` translates causal / sliding window / scale / GQA for either varlen signature
    (grouped heads on the old one go to the engine's own op, here a CPU stand-in)."""
    import inspect

    import areal_tasks.kernels.attention as attn

    monkeypatch.setattr(attn, "_varlen_api", lambda: (api, frozenset(inspect.signature(api).parameters)))
    monkeypatch.setattr(attn, "_gqa_op", native_gqa)
    if api is old_api and window is not None:
        with pytest.raises(attn.EngineError, match="window_size"):
            attn.varlen_packed(
                torch.zeros(4, 2, 8),
                torch.zeros(4, 2, 8),
                torch.zeros(4, 2, 8),
                torch.tensor([0, 4]),
                4,
                sliding_window=window,
            )
        return
    gen = torch.Generator().manual_seed(0)
    bounds = (0, 1, 6, 15, 19)
    q = torch.randn(1, 4, 19, 16, generator=gen)
    k, v = torch.randn(1, 2, 19, 16, generator=gen), torch.randn(1, 2, 19, 16, generator=gen)
    out = attn.varlen_packed(
        q[0].transpose(0, 1),
        k[0].transpose(0, 1),
        v[0].transpose(0, 1),
        torch.tensor(bounds),
        9,
        scaling=scaling,
        sliding_window=window,
    )
    ref = _alone(q * (1.0 if scaling is None else scaling / 0.25), k, v, bounds, window)  # _alone scales by 0.25
    torch.testing.assert_close(out.transpose(0, 1).unsqueeze(0), ref, atol=1e-5, rtol=1e-5)


def test_kernel_choice_on_cpu_is_per_sequence():
    from areal_tasks.kernels.attention import packed_kernel, varlen_supported

    q = torch.zeros(1, 2, 4, 8, dtype=torch.bfloat16)
    assert not varlen_supported(q) and packed_kernel(q) == "per_sequence"


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_areal_varlen_model_equals_sdpa_on_packed_input(family, tiny_model_factory):
    """The registered ``areal_varlen`` attention (one SDPA call per sequence on CPU) gives transformers'
    own packed-sdpa logits; a plain call without bounds is ordinary causal attention."""
    from transformers import AutoModelForCausalLM

    from areal_tasks.engine.microbatch import position_ids_from_cu_seqlens
    from areal_tasks.kernels.attention import BOUNDS_KWARG, register_varlen_attention

    path = str(tiny_model_factory(family))
    ours = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register_varlen_attention())
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    bounds = (0, 5, 6, 15, 18)
    cu = torch.tensor(bounds, dtype=torch.int32)
    ids = torch.randint(0, 500, (1, 18), generator=torch.Generator().manual_seed(0))
    pos = position_ids_from_cu_seqlens(cu)[None]
    kwargs = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 9, "max_length_k": 9, BOUNDS_KWARG: bounds}
    with torch.no_grad():
        got = ours(input_ids=ids, position_ids=pos, use_cache=False, **kwargs).logits
        want = ref(input_ids=ids, position_ids=pos, use_cache=False).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        plain = ours(input_ids=ids[:, :5], use_cache=False).logits
        torch.testing.assert_close(plain, want[:, :5], atol=1e-5, rtol=1e-5)
