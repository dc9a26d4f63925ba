"""The train benchmark's batches run exactly the micro-batches it names: the sequences that a
long-tail mix spills into a nearly empty extra micro-batch are left out, and nothing else is."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.microbatch import sequence_lengths, split_into_micro_batches
from benchmarks.train_batches import fill_micro_batches, long_tail_batch


@pytest.mark.parametrize("seed", [0, 1, 5, 7])
def test_fill_keeps_exactly_the_named_micro_batches(seed: int) -> None:
    spec = MicroBatchSpec(n_mbs=1, max_tokens_per_mb=4096)
    batch = long_tail_batch(2 * 4096, 4096, vocab=100, seed=seed)
    spilled = split_into_micro_batches(batch, spec)
    assert spilled.n_micro_batches == 3  # the mix never packs exactly: the case the fill is for

    filled = fill_micro_batches(batch, spec, 2)
    plan = split_into_micro_batches(filled, spec)
    assert plan.n_micro_batches == 2
    assert plan.tokens_per_micro_batch() == spilled.tokens_per_micro_batch()[:2]
    dropped = sorted(sequence_lengths(batch))
    for n in sequence_lengths(filled):
        dropped.remove(n)
    assert sum(dropped) == spilled.tokens_per_micro_batch()[2]
    # kept sequences keep their tokens, in order
    starts = batch["cu_seqlens"][:-1].tolist()
    first = filled["input_ids"][: sequence_lengths(filled)[0]]
    assert any(torch.equal(batch["input_ids"][s : s + len(first)], first) for s in starts)


def test_fill_leaves_a_batch_that_already_fits() -> None:
    spec = MicroBatchSpec(n_mbs=1, max_tokens_per_mb=4096)
    batch = long_tail_batch(3000, 4096, vocab=100, seed=3)
    assert fill_micro_batches(batch, spec, 2) is batch
