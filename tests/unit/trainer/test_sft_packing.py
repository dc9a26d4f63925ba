"""SFT packing: the loss mask covers exactly the assistant tokens and the packed layout is valid."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.datasets import render_prompt, render_transcript
from areal_tasks.engine.microbatch import dp_split
from areal_tasks.errors import ConfigError
from areal_tasks.models import load_tokenizer
from areal_tasks.trainer.sft_data import pack_transcripts, sft_loss, sft_loss_weight
from areal_tasks.trainer.sft_loop import step_indices


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny:qwen2")


def test_assistant_only_loss_mask(tokenizer) -> None:
    prompt, response = "What is 3 + 4?", "Answer: 7"
    ids, mask = render_transcript(tokenizer, prompt, response)
    prompt_ids = render_prompt(tokenizer, prompt)
    assert ids[: len(prompt_ids)] == prompt_ids
    assert not any(mask[: len(prompt_ids)])
    trained = [t for t, m in zip(ids, mask) if m]
    assert tokenizer.decode(trained) == response + tokenizer.eos_token


def test_packed_layout_is_valid(tokenizer) -> None:
    transcripts = [render_transcript(tokenizer, f"What is {i} + {i}?", f"Answer: {2 * i}") for i in range(6)]
    batch = pack_transcripts(transcripts)
    lengths = [len(ids) for ids, _ in transcripts]
    assert batch["cu_seqlens"].tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["input_ids"].shape == batch["loss_mask"].shape == batch["position_ids"].shape
    for i, (ids, mask) in enumerate(transcripts):
        lo, hi = batch["cu_seqlens"][i].item(), batch["cu_seqlens"][i + 1].item()
        assert batch["input_ids"][lo:hi].tolist() == ids
        assert batch["position_ids"][lo:hi].tolist() == list(range(len(ids)))
        assert batch["loss_mask"][lo].item() == 0
        assert batch["loss_mask"][lo:hi].tolist() == mask
    shares = dp_split(batch, 2)
    assert sum(len(s["cu_seqlens"]) - 1 for s in shares) == 6
    assert sum(sft_loss_weight(s) for s in shares) == sft_loss_weight(batch)


def test_first_token_never_trained_and_bad_input_rejected() -> None:
    batch = pack_transcripts([([5, 6, 7], [1, 1, 1])])
    assert batch["loss_mask"].tolist() == [0, 1, 1]
    with pytest.raises(ConfigError, match="same length"):
        pack_transcripts([([5, 6, 7], [1, 1])])
    with pytest.raises(ConfigError, match="empty"):
        pack_transcripts([])


def test_sft_loss_is_token_mean_nll_over_the_mask() -> None:
    mb = {"loss_mask": torch.tensor([0, 1, 1, 0, 1])}
    logprobs = torch.tensor([-9.0, -1.0, -2.0, -9.0, -3.0])
    loss, _ = sft_loss({"logprobs": logprobs}, mb)
    assert loss.item() == pytest.approx(2.0)
    assert sft_loss_weight(mb) == 3.0


def test_step_indices_cover_each_epoch_once() -> None:
    picked = [i for step in range(5) for i in step_indices(10, 4, step, seed=1, shuffle=True)]
    assert sorted(picked[:10]) == list(range(10)) and sorted(picked[10:20]) == list(range(10))
    assert step_indices(10, 4, 2, seed=1, shuffle=True) == step_indices(10, 4, 2, seed=1, shuffle=True)
    assert step_indices(10, 4, 0, seed=1, shuffle=False) == [0, 1, 2, 3]
