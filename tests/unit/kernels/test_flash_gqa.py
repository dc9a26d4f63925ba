"""The grouped-head flash attention ops (``kernels/flash_gqa.py``) and when ``varlen_packed``
uses them, without a GPU.

On ``meta`` tensors the ops run torch's own flash kernels' shape functions, so the forward and
backward wiring (the arguments this torch's ``aten::_flash_attention_forward``/``_backward`` take,
what the backward returns, the fake implementation's log-sum-exp shape) is checked against the
installed torch, and ``torch.library.opcheck`` checks the registration as ``torch.compile`` uses
it. ``varlen_packed`` is driven with a stand-in for torch's ``varlen_attn`` to check the routing:
grouped heads on a torch without ``enable_gqa`` go to the op with the right scale and an unscaled
query, with ``enable_gqa`` to torch's op, and a sliding window repeats the heads. The numbers are
checked on a GPU (``tests/gpu/test_varlen_attention_gpu.py``).
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.errors import EngineError
from areal_tasks.kernels import attention
from areal_tasks.kernels.flash_gqa import flash_varlen_gqa

TOKENS, HEADS, KV_HEADS, DIM = 100, 14, 2, 64


def _meta(heads: int, *, grad: bool = True) -> torch.Tensor:
    return torch.empty(TOKENS, heads, DIM, device="meta", dtype=torch.bfloat16, requires_grad=grad)


def test_forward_and_backward_run_torchs_kernels_shape_functions() -> None:
    q, k, v = _meta(HEADS), _meta(KV_HEADS), _meta(KV_HEADS)
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    out = flash_varlen_gqa(q, k, v, cu, 50, 0.125)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    grads = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_the_fake_log_sum_exp_has_the_kernels_shape() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k = _meta(HEADS, grad=False), _meta(KV_HEADS, grad=False)
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    _, real_lse = torch.ops.areal_tasks.flash_varlen_forward(q, k, k, cu, 50, 0.1)
    with FakeTensorMode():
        fq = torch.empty(TOKENS, HEADS, DIM, dtype=torch.bfloat16)
        fk = torch.empty(TOKENS, KV_HEADS, DIM, dtype=torch.bfloat16)
        _, fake_lse = torch.ops.areal_tasks.flash_varlen_forward(fq, fk, fk, torch.empty(4, dtype=torch.int32), 50, 0.1)
    assert tuple(fake_lse.shape) == tuple(real_lse.shape) and fake_lse.dtype == real_lse.dtype


def test_the_registration_passes_opcheck() -> None:
    q, k, v = _meta(HEADS), _meta(KV_HEADS), _meta(KV_HEADS)
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    result = torch.library.opcheck(torch.ops.areal_tasks.flash_varlen_forward, (q, k, v, cu, 50, 0.1))
    assert set(result.values()) == {"SUCCESS"}, result


def test_mismatched_key_and_value_heads_are_refused() -> None:
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    with pytest.raises(EngineError, match="must match and divide"):
        flash_varlen_gqa(_meta(HEADS), _meta(3), _meta(3), cu, 50, 0.1)


class _TorchVarlen:
    """Stands in for ``torch.nn.attention.varlen.varlen_attn``: records its call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        self.calls.append((q, k, v, kwargs))
        return torch.zeros_like(q)


@pytest.fixture
def routed(monkeypatch):
    """(torch's stand-in, the native op's calls), with this torch's varlen API replaced."""

    def use(params: set[str]):
        fn, native = _TorchVarlen(), []
        monkeypatch.setattr(attention, "_varlen", (fn, frozenset(params)))
        monkeypatch.setattr(attention, "_gqa_op", lambda *args: native.append(args) or torch.zeros_like(args[0]))
        return fn, native

    return use


def _inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(TOKENS, HEADS, DIM, generator=gen)
    k, v = torch.randn(TOKENS, KV_HEADS, DIM, generator=gen), torch.randn(TOKENS, KV_HEADS, DIM, generator=gen)
    return q, k, v, torch.tensor([0, 40, TOKENS], dtype=torch.int64)


@pytest.mark.parametrize("scaling", [None, 0.1])
def test_grouped_heads_without_enable_gqa_go_to_the_native_op(routed, scaling) -> None:
    fn, native = routed({"window_size", "is_causal"})  # torch 2.11's varlen_attn: neither scale nor enable_gqa
    q, k, v, cu = _inputs()
    attention.varlen_packed(q, k, v, cu, 60, scaling=scaling)
    assert not fn.calls
    ((nq, nk, nv, ncu, max_len, scale),) = native
    assert nq is q and nk is k and nv is v  # the query is not pre-scaled, the heads not repeated
    assert ncu.dtype == torch.int32 and max_len == 60
    assert scale == pytest.approx(DIM**-0.5 if scaling is None else scaling)


def test_enable_gqa_keeps_torchs_op(routed) -> None:
    fn, native = routed({"window_size", "is_causal", "scale", "enable_gqa"})
    q, k, v, cu = _inputs()
    attention.varlen_packed(q, k, v, cu, 60)
    assert not native
    ((_, fk, _, kwargs),) = fn.calls
    assert kwargs["enable_gqa"] is True and fk.shape[1] == KV_HEADS


def test_a_sliding_window_without_enable_gqa_repeats_the_heads(routed) -> None:
    fn, native = routed({"window_size", "is_causal"})
    q, k, v, cu = _inputs()
    attention.varlen_packed(q, k, v, cu, 60, sliding_window=16)
    assert not native
    ((_, fk, fv, kwargs),) = fn.calls
    assert fk.shape[1] == fv.shape[1] == HEADS and kwargs["window_size"] == (15, 0)
    torch.testing.assert_close(fk[:, : HEADS // KV_HEADS], k[:, :1].expand(-1, HEADS // KV_HEADS, -1))
