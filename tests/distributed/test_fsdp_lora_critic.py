"""LoRA through peft (dp=2) matches a plain single-process peft model step for step (only adapters
train), and its merged and adapter-only exports load in plain transformers/peft with the engine's
log-probs. The critic variant (value head) matches a plain token-classification model."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import (
    ATOL,
    RTOL,
    make_batch,
    max_abs_diff,
    reference_logprobs,
    sequences,
    token_mean_loss,
    value_loss,
)
from launch import run_workers

pytestmark = pytest.mark.distributed


def _peft_reference(model_dir):
    from transformers import AutoModelForCausalLM
    from workers_fsdp import LORA

    from areal_tasks.config.engine import LoRAConfig
    from areal_tasks.models.lora import apply_lora

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    return apply_lora(base, LoRAConfig(**LORA), seed=1)


def test_lora_matches_plain_peft_and_exports(tiny_qwen2, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_workers("workers_fsdp:lora_run", 2, tmp_path, {"model_dir": str(tiny_qwen2)})
    res = torch.load(tmp_path / "result.pt", weights_only=False)

    ref = _peft_reference(tiny_qwen2)
    trainable = [p for p in ref.parameters() if p.requires_grad]
    assert all(".lora_" in n for n, p in ref.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.01)
    batches = [make_batch(seed=0), make_batch(seed=1)]
    loss, _ = token_mean_loss({"logprobs": reference_logprobs(ref, batches[0])}, batches[0])
    loss.backward()
    opt.step()
    opt.zero_grad()
    loss, _ = token_mean_loss({"logprobs": reference_logprobs(ref, batches[1])}, batches[1])
    loss.backward()

    assert res["stats"]["loss"] == pytest.approx(float(loss.detach()), abs=ATOL)
    assert set(res["grads"]) == {n for n, p in ref.named_parameters() if p.requires_grad}
    diff, name = max_abs_diff(res["grads"], {n: p.grad for n, p in ref.named_parameters() if p.requires_grad})
    assert diff < ATOL, f"gradient of {name} differs by {diff}"
    diff, name = max_abs_diff(res["params"], {n: p.detach() for n, p in ref.named_parameters()})
    assert diff < ATOL, f"parameter {name} after one step differs by {diff}"

    with torch.no_grad():
        expected = reference_logprobs(ref, batches[1])
        torch.testing.assert_close(res["forward"]["logprobs"], expected, atol=ATOL, rtol=RTOL)
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
        torch.testing.assert_close(reference_logprobs(merged, batches[1]), expected, atol=ATOL, rtol=RTOL)
        base = AutoModelForCausalLM.from_pretrained(str(tiny_qwen2), dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        torch.testing.assert_close(reference_logprobs(adapted, batches[1]), expected, atol=ATOL, rtol=RTOL)


def test_critic_matches_token_classification_reference(tiny_qwen2, tmp_path):
    from areal_tasks.models.critic import load_critic

    run_workers("workers_fsdp:critic_run", 2, tmp_path, {"model_dir": str(tiny_qwen2)})
    res = torch.load(tmp_path / "result.pt", weights_only=False)

    model = load_critic(str(tiny_qwen2), dtype=torch.float32, attn_implementation="eager")
    batch = make_batch(seed=0)
    values = []
    for ids in sequences(batch):
        v = model(input_ids=ids[None]).logits[0, :, 0]
        values.append(torch.cat([v.new_zeros(1), v[:-1]]))
    values = torch.cat(values)
    loss, _ = value_loss({"values": values}, batch)
    loss.backward()
    assert res["stats"]["loss"] == pytest.approx(float(loss.detach()), abs=ATOL)
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads["score.weight"].abs().sum() > 0
    diff, name = max_abs_diff(res["grads"], grads)
    assert diff < ATOL, f"gradient of {name} differs by {diff}"
    torch.testing.assert_close(res["forward"]["values"], values.detach(), atol=ATOL, rtol=RTOL)
