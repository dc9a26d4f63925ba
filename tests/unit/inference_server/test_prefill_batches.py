"""How admission splits fresh prompts into prefill batches (``Prefiller._chunks``) and how a batch's
token ids are laid out (``right_padded``)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from areal_tasks.inference.server.model_runner import right_padded
from areal_tasks.inference.server.prefill import MAX_DISTINCT_LENGTHS, Prefiller


def _reference_chunks(lengths: list[int], budget: int) -> list[list[int]]:
    """The rule, written out: sorted by length, a batch closes before the prompt that would take
    it past ``budget`` padded tokens or past MAX_DISTINCT_LENGTHS lengths."""
    chunks: list[list[int]] = []
    for length in sorted(lengths):
        if chunks:
            grown = [*chunks[-1], length]
            if len(grown) * length <= budget and len(set(grown)) <= MAX_DISTINCT_LENGTHS:
                chunks[-1] = grown
                continue
        chunks.append([length])
    return chunks


def test_prefill_batches_follow_the_padded_token_budget_and_the_distinct_length_bound() -> None:
    rng = random.Random(0)
    for _ in range(300):
        budget = rng.choice([64, 256, 1024, 8192])
        lengths = [rng.choice([rng.randint(1, 300), 128, 16]) for _ in range(rng.randint(1, 200))]
        seqs = [SimpleNamespace(prompt_ids=[7] * n) for n in lengths]
        fake = SimpleNamespace(max_prefill_tokens=budget)
        chunks = Prefiller._chunks(fake, seqs)  # type: ignore[arg-type]
        assert [[len(s.prompt_ids) for s in chunk] for chunk in chunks] == _reference_chunks(lengths, budget)
        assert sorted(id(s) for chunk in chunks for s in chunk) == sorted(id(s) for s in seqs)


def test_right_padded_lays_rows_out_with_zeros_after_each_prompt() -> None:
    rows = [[5, 6, 7], [9], [1, 2, 3, 4]]
    ids = right_padded(rows, 5)
    assert ids.dtype == torch.long and ids.device.type == "cpu"
    assert ids.tolist() == [[5, 6, 7, 0, 0], [9, 0, 0, 0, 0], [1, 2, 3, 4, 0]]
    assert right_padded([[3, 1]], 2).tolist() == [[3, 1]]
