"""Micro-batch splitting, merging back, padding, DP splitting and n_mbs agreement on CPU."""

from __future__ import annotations

import random

import pytest
import torch

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.microbatch import (
    agree_on_n_mbs,
    dp_partition,
    dp_split,
    position_ids_from_cu_seqlens,
    select_sequences,
    sequence_lengths,
    split_into_micro_batches,
)
from areal_tasks.errors import ConfigError, EngineError


def make_batch(lengths: list[int], group_size: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """A packed batch whose token values encode (sequence, position) so misplacement shows."""
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    seq_of_token = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    loss_mask = torch.ones(total, dtype=torch.int32)
    loss_mask[cu[:-1].long()] = 0
    return {
        "input_ids": seq_of_token * 10_000 + position_ids_from_cu_seqlens(cu),
        "cu_seqlens": cu,
        "loss_mask": loss_mask,
        "logprobs": -torch.rand(total, generator=gen),
        "advantages": torch.randn(total, 2, generator=gen),
        "rewards": torch.arange(len(lengths), dtype=torch.float32),
        "group_ids": torch.arange(len(lengths)) // group_size,
        "seq_stats": torch.randn(len(lengths), 3, generator=gen),
    }


def random_lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 300) for _ in range(n)]


def test_position_ids_restart_per_sequence() -> None:
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    assert position_ids_from_cu_seqlens(cu).tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    with_empty = torch.tensor([0, 2, 2, 5, 5])  # zero-length sequences contribute no position
    assert position_ids_from_cu_seqlens(with_empty).tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("packing", ["ffd", "kk"])
@pytest.mark.parametrize("pad", [1, 8])
def test_micro_batches_are_valid_packed_batches_with_the_right_rows(packing: str, pad: int) -> None:
    lengths = random_lengths(24, seed=1)
    batch = make_batch(lengths)
    spec = MicroBatchSpec(n_mbs=3, max_tokens_per_mb=1000, packing=packing, pad_to_multiple_of=pad)
    plan = split_into_micro_batches(batch, spec)

    assert plan.n_micro_batches >= 3
    assert sorted(i for part in plan.indices for i in part) == list(range(24))
    for mb, part in zip(plan.micro_batches, plan.indices):
        mb_lengths = sequence_lengths(mb)  # raises if any key has the wrong number of rows
        assert mb["cu_seqlens"].dtype == torch.int32
        assert torch.equal(mb["position_ids"], position_ids_from_cu_seqlens(mb["cu_seqlens"]))
        assert sum(mb_lengths) % pad == 0 and sum(mb_lengths) <= 1000
        cu = mb["cu_seqlens"].tolist()
        for j, i in enumerate(part):
            src = slice(int(batch["cu_seqlens"][i]), int(batch["cu_seqlens"][i + 1]))
            dst = slice(cu[j], cu[j + 1])
            for key in ("input_ids", "loss_mask", "logprobs", "advantages"):
                assert torch.equal(mb[key][dst], batch[key][src]), key
            for key in ("rewards", "group_ids", "seq_stats"):
                assert torch.equal(mb[key][j], batch[key][i]), key
    assert plan.n_tokens == sum(lengths)
    assert sum(plan.tokens_per_micro_batch()) == plan.n_tokens + plan.n_padded_tokens


def test_padding_is_one_dummy_sequence_with_loss_mask_zero() -> None:
    batch = make_batch([5, 6, 7])
    plan = split_into_micro_batches(batch, MicroBatchSpec(n_mbs=1, pad_to_multiple_of=8))
    (mb,) = plan.micro_batches
    assert mb["cu_seqlens"].tolist() == [0, 5, 11, 18, 24]
    assert plan.n_padded_tokens == 6
    assert mb["loss_mask"][18:].tolist() == [0] * 6
    assert mb["position_ids"][18:].tolist() == list(range(6))
    assert mb["rewards"].tolist() == [0.0, 1.0, 2.0, 0.0]
    assert int(mb["loss_mask"].sum()) == int(batch["loss_mask"].sum())


def test_cap_counts_padding() -> None:
    lengths = [60, 60, 60, 60]
    plan = split_into_micro_batches(make_batch(lengths), MicroBatchSpec(max_tokens_per_mb=130, pad_to_multiple_of=16))
    # 2 x 60 = 120 fits 128 (130 rounded down to a multiple of 16) once padded to 128.
    assert plan.tokens_per_micro_batch() == [128, 128]


def test_dummy_micro_batches_make_up_the_required_count() -> None:
    batch = make_batch([3, 4])
    plan = split_into_micro_batches(batch, MicroBatchSpec(n_mbs=4, pad_to_multiple_of=2))
    assert plan.n_micro_batches == 4
    assert plan.indices[2:] == [[], []]
    for mb in plan.micro_batches[2:]:
        assert mb["cu_seqlens"].tolist() == [0, 2]
        assert mb["loss_mask"].tolist() == [0, 0]
        assert set(mb) == set(plan.micro_batches[0])
    merged = plan.merge([mb["logprobs"] for mb in plan.micro_batches])
    assert torch.equal(merged, batch["logprobs"])


@pytest.mark.parametrize("packing", ["ffd", "kk"])
def test_merge_restores_original_order(packing: str) -> None:
    lengths = random_lengths(30, seed=2)
    batch = make_batch(lengths)
    spec = MicroBatchSpec(n_mbs=4, max_tokens_per_mb=1200, packing=packing, pad_to_multiple_of=4)
    plan = split_into_micro_batches(batch, spec)
    assert [i for part in plan.indices for i in part] != list(range(30)), "the plan must reorder for this test"
    for key in ("input_ids", "logprobs", "advantages", "rewards", "seq_stats"):
        merged = plan.merge([mb[key] for mb in plan.micro_batches])
        assert torch.equal(merged, batch[key]), key


def test_merge_rejects_mismatched_outputs() -> None:
    plan = split_into_micro_batches(make_batch([3, 4, 5]), MicroBatchSpec(n_mbs=2))
    with pytest.raises(EngineError, match="outputs for"):
        plan.merge([plan.micro_batches[0]["logprobs"]])
    with pytest.raises(EngineError, match="match neither"):
        plan.merge([torch.zeros(100) for _ in plan.micro_batches])


def test_granularity_keeps_groups_in_one_micro_batch() -> None:
    lengths = random_lengths(32, seed=3)
    batch = make_batch(lengths, group_size=4)
    spec = MicroBatchSpec(n_mbs=3, max_tokens_per_mb=2000, packing="kk", granularity=4)
    plan = split_into_micro_batches(batch, spec)
    seen: dict[int, int] = {}
    for k, mb in enumerate(plan.micro_batches):
        for group in mb["group_ids"].tolist():
            assert seen.setdefault(group, k) == k
    assert sorted(seen) == list(range(8))


def test_n_mbs_override_raises_the_count() -> None:
    batch = make_batch(random_lengths(10, seed=4))
    spec = MicroBatchSpec(n_mbs=1)
    assert split_into_micro_batches(batch, spec).n_micro_batches == 1
    assert split_into_micro_batches(batch, spec, n_mbs_override=3).n_micro_batches == 3
    with pytest.raises(ConfigError, match="n_mbs_override"):
        split_into_micro_batches(batch, spec, n_mbs_override=0)


def test_split_errors_name_the_problem() -> None:
    batch = make_batch([3, 4])
    with pytest.raises(EngineError, match="more than max_tokens=5"):
        split_into_micro_batches(make_batch([3, 9]), MicroBatchSpec(max_tokens_per_mb=5))
    with pytest.raises(ConfigError, match="smaller than pad_to_multiple_of"):
        split_into_micro_batches(batch, MicroBatchSpec(max_tokens_per_mb=4, pad_to_multiple_of=8))
    bad = dict(batch, logprobs=torch.zeros(3))
    with pytest.raises(EngineError, match="'logprobs' has first dimension 3, expected 7 tokens"):
        split_into_micro_batches(bad, MicroBatchSpec())
    with pytest.raises(EngineError, match="needs 'cu_seqlens'"):
        split_into_micro_batches({"input_ids": torch.zeros(3)}, MicroBatchSpec())
    with pytest.raises(EngineError, match="out of range"):
        select_sequences(batch, [2])


def test_dp_split_balances_tokens_and_keeps_groups_whole() -> None:
    for seed in range(5):
        lengths = random_lengths(64, seed=10 + seed)
        batch = make_batch(lengths, group_size=4)
        shards = dp_split(batch, 4, granularity=4)
        assert len(shards) == 4
        sums = [int(shard["cu_seqlens"][-1]) for shard in shards]
        assert sum(sums) == sum(lengths)
        biggest_group = max(sum(lengths[i : i + 4]) for i in range(0, 64, 4))
        assert max(sums) - min(sums) <= biggest_group
        groups = [set(shard["group_ids"].tolist()) for shard in shards]
        assert sum(len(g) for g in groups) == 16, "a group landed on two ranks"
        for shard in shards:
            sequence_lengths(shard)
            assert (shard["group_ids"].bincount()[shard["group_ids"].unique()] == 4).all()


def test_dp_split_needs_a_group_per_rank() -> None:
    batch = make_batch([5, 5, 5, 5])
    assert [sorted(p) for p in dp_partition(batch, 2, granularity=2)] == [[0, 1], [2, 3]]
    with pytest.raises(EngineError, match="between 3 data-parallel ranks"):
        dp_split(batch, 3, granularity=2)


def test_agree_on_n_mbs_without_distributed_is_the_local_count() -> None:
    assert not torch.distributed.is_initialized()
    assert agree_on_n_mbs(3) == 3


def test_agree_on_n_mbs_runs_the_collective_in_a_one_rank_group(tmp_path) -> None:
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert agree_on_n_mbs(5) == 5
        assert agree_on_n_mbs(2, dist.group.WORLD) == 2
    finally:
        dist.destroy_process_group()
