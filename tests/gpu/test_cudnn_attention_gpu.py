"""cuDNN's fused varlen attention (``attn_implementation="areal_varlen_cudnn"``) on a CUDA GPU
(skipped without CUDA): the same block-diagonal causal attention as the fp32 block-mask reference
in bf16, forward and backward, with GQA (the Qwen2.5-0.5B shape's 14/2 heads) and without, with a
non-default scale, eager and inside a compiled function; and as a decoder block's attention under
``torch.compile`` through transformers' attention interface.

Tolerances are bf16's (relative norms of ~1e-2), as in ``test_varlen_attention_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

LENGTHS = (1, 37, 700, 2048, 5, 1500, 300, 64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


def _inputs(n_q: int, n_kv: int, head_dim: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = sum(LENGTHS)
    bounds = tuple(int(x) for x in torch.tensor((0, *LENGTHS)).cumsum(0).tolist())
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(1, n, total, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
               for n in (n_q, n_kv, n_kv))
    grad_out = torch.randn(1, n_q, total, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    return q, k, v, cu, bounds, grad_out


def _reference(q, k, v, cu, scaling):
    from areal_tasks.engine.fsdp.attention import block_causal_mask, repeat_heads

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q32, repeat_heads(k32, rep), repeat_heads(v32, rep), attn_mask=block_causal_mask(cu, q.shape[2]),
        scale=scaling)
    return out, (q32, k32, v32)


@pytest.mark.parametrize("heads", [(14, 2), (8, 8)], ids=["gqa-14-2", "mha-8"])
@pytest.mark.parametrize("scaling", [None, 0.1], ids=["default-scale", "scale0.1"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cudnn_matches_block_mask_sdpa(heads, scaling, compiled):
    from areal_tasks.engine.fsdp.attention import packed_attention, packed_kernel
    from areal_tasks.engine.fsdp.cudnn_attention import register_cudnn_ops

    register_cudnn_ops()
    q, k, v, cu, bounds, grad_out = _inputs(*heads)
    assert packed_kernel(q, prefer="cudnn") == "cudnn"

    def attend(q, k, v, cu):
        return packed_attention(q, k, v, cu, max_len=max(LENGTHS), scaling=scaling, prefer="cudnn")

    fn = torch.compile(attend, fullgraph=True, dynamic=True) if compiled else attend
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, cu)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    out.backward(grad_out)
    ref, leaves = _reference(q, k, v, cu, scaling)
    ref.backward(grad_out.float())
    assert _rel(out, ref) < 1e-2, f"output differs: {_rel(out, ref)}"
    for name, got, want in zip("qkv", (q, k, v), leaves):
        assert _rel(got.grad, want.grad) < 2e-2, f"d{name} differs: {_rel(got.grad, want.grad)}"


def test_compiled_decoder_block_with_cudnn_attention_matches_flash():
    """A Qwen2 decoder layer compiled with each attention: outputs and parameter gradients agree."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    from areal_tasks.engine.fsdp.attention import register_varlen_attention, register_varlen_cudnn_attention

    results = {}
    for name in (register_varlen_attention(), register_varlen_cudnn_attention()):
        torch.manual_seed(0)
        config = Qwen2Config(hidden_size=896, intermediate_size=1024, num_attention_heads=14, num_key_value_heads=2,
                             num_hidden_layers=1, vocab_size=128)
        config._attn_implementation = name
        layer = Qwen2DecoderLayer(config, 0).cuda().to(torch.bfloat16)
        rotary = Qwen2RotaryEmbedding(config).cuda()
        total = sum(LENGTHS)
        bounds = torch.tensor((0, *LENGTHS)).cumsum(0)
        position_ids = torch.cat([torch.arange(n) for n in LENGTHS]).cuda()[None]
        cu = bounds.to(torch.int32).cuda()
        hidden = torch.randn(1, total, 896, device="cuda", dtype=torch.bfloat16, generator=torch.Generator(
            device="cuda").manual_seed(1), requires_grad=True)
        embeddings = rotary(hidden, position_ids)
        compiled = torch.compile(layer, dynamic=True)
        out = compiled(hidden, attention_mask=None, position_ids=position_ids, position_embeddings=embeddings,
                       cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(LENGTHS), max_length_k=max(LENGTHS))
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()
        results[name] = (out.detach(), {n: p.grad.detach().clone() for n, p in layer.named_parameters()})
    (flash_out, flash_grads), (cudnn_out, cudnn_grads) = results.values()
    assert _rel(cudnn_out, flash_out) < 1e-2
    for n, g in flash_grads.items():
        assert _rel(cudnn_grads[n], g) < 3e-2, f"{n}: {_rel(cudnn_grads[n], g)}"
