"""Fidelity of ArealOpenAI against a real server: a two-turn chat on the tiny qwen2 model through the
embedded server's client, exported as one trajectory whose recorded log-probs a teacher-forced
transformers forward over the recorded tokens reproduces (fp32: within 1e-4), and whose recorded
output ids decode to exactly the text the agent received."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from areal_tasks.agent.client import ArealOpenAI
from areal_tasks.api.inference import SamplingParams


def _recomputed_logprobs(model, input_ids: list[int]) -> list[float]:
    """log p(input_ids[t] | input_ids[<t]) for every t >= 1 (0 at t = 0), by a fp32 forward."""
    import torch

    ids = torch.tensor([input_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    picked = torch.log_softmax(logits, -1).gather(1, ids[0, 1:].view(-1, 1)).view(-1)
    return [0.0, *picked.tolist()]


def test_two_turn_chat_logprobs_match_a_recomputation(
    agent_server: str, admin_key: str, reference_model, tiny_qwen2: Path
) -> None:
    from transformers import AutoTokenizer

    from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)

    async def episode() -> ArealOpenAI:
        cfg = ClientConfig(request_timeout_s=120.0, max_retries=1, admin_api_key=admin_key)
        engine = RemoteInferenceEngine([agent_server], make_adapter("embedded"), cfg)
        try:
            client = ArealOpenAI(engine, tok, sampling=sampling)
            messages = [{"role": "system", "content": "You add."}, {"role": "user", "content": "What is 2+3?"}]
            first = await client.chat.completions.create(model="tiny", messages=messages, logprobs=True)
            messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "And 4+4?"}]
            await client.chat.completions.create(model="tiny", messages=messages, seed=8)
            return client
        finally:
            await engine.aclose()

    client = asyncio.run(episode())
    first, second = list(client.cache)
    assert second.parent_id == first.id  # the second turn extends the first: one conversation
    for item in (first, second):
        ids = item.output_ids[:-1] if item.ended_with is not None else item.output_ids
        assert tok.decode(ids, skip_special_tokens=False) == item.message["content"]
    client.cache.set_last_reward(1.0)
    (traj,) = client.cache.export("concat")
    assert traj.metadata["turns"] == 2
    assert sum(traj.loss_mask) == len(first.output_ids) + len(second.output_ids)
    expected = _recomputed_logprobs(reference_model, traj.input_ids)
    got = [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m]
    want = [lp for lp, m in zip(expected, traj.loss_mask) if m]
    assert got == pytest.approx(want, abs=1e-4) and min(got) < -1e-3  # sampled, not all-certain tokens
    chat_lps = [c.logprob for c in first.completion.choices[0].logprobs.content]
    assert chat_lps == first.output_logprobs[: len(chat_lps)]
