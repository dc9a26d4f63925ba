"""Choosing the grouped decode attention: the runner refuses an unknown choice and a Triton kernel
it cannot run (naming the options), keeps SDPA on the CPU under ``auto``, and once the kernel is
turned on the serving attention routes exactly the grouped decode calls to it (checked on the CPU
with the kernel replaced by its PyTorch reference: the same greedy logits as SDPA). The kernel
itself runs on a GPU: ``tests/gpu/test_decode_kernel_gpu.py``."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server import attention
from areal_tasks.inference.server.decode_kernel import reference_decode_attention
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig


def test_unknown_choice_is_refused(tiny_qwen2) -> None:
    with pytest.raises(InferenceError, match="decode_attention must be one of auto, triton, sdpa, got 'flash'"):
        ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu", decode_attention="flash"))


def test_triton_without_cuda_is_refused_with_the_alternatives(tiny_qwen2) -> None:
    with pytest.raises(InferenceError, match="needs a CUDA device and the triton package; use 'auto'"):
        ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu", decode_attention="triton"))


def test_auto_keeps_sdpa_on_the_cpu(tiny_qwen2) -> None:
    runner = ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu"))
    assert runner.decode_attention == "sdpa"
    assert not any(getattr(m, attention.DECODE_KERNEL_ATTR, False) for m in runner.model.modules())


def test_grouped_decode_calls_go_to_the_kernel_once_turned_on(tiny_qwen2, monkeypatch) -> None:
    calls: list[tuple[int, ...]] = []

    def fake_kernel(query, key, value, mask, scale):  # the kernel's contract, computed by its reference
        calls.append(tuple(query.shape))
        allowed = None if mask is None else (mask if mask.dtype == torch.bool else mask == 0)
        return reference_decode_attention(query, key, value, allowed, scale)

    monkeypatch.setattr(attention, "decode_attention", fake_kernel)
    monkeypatch.setattr(attention, "kernel_fits", lambda query, key, value, mask: True)
    runner = ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=4))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    slots = [runner.cache.allocate() for _ in prompts]
    first = runner.prefill_batch(slots, prompts).argmax(-1).tolist()
    plain = runner.decode(slots, first, [len(p) for p in prompts])
    for slot, prompt in zip(slots, prompts):  # the same decode step again, through the kernel
        runner.cache.lengths[slot] = len(prompt)
    layers = attention.use_decode_kernel(runner.model)
    assert calls == []  # prefill and SDPA decode above never called it
    routed = runner.decode(slots, first, [len(p) for p in prompts])
    heads = runner.config.num_attention_heads
    kv_heads = runner.config.num_key_value_heads
    assert layers == runner.config.num_hidden_layers
    assert calls == [(2, kv_heads, heads // kv_heads, runner.config.hidden_size // heads)] * layers
    torch.testing.assert_close(routed, plain, rtol=1e-4, atol=1e-4)
