"""Packed vision-language batches: splitting into micro-batches (and data-parallel shares) keeps
every sequence's images and their patch rows with it, in order; dummy padding holds no image; the
image keys are validated; trajectories and transcripts pack their images into the batch keys."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.api.workflow import Trajectory
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.image_rows import pack_images
from areal_tasks.engine.microbatch import dp_split, select_sequences, sequence_lengths, split_into_micro_batches
from areal_tasks.errors import AlgorithmError, ConfigError, EngineError
from areal_tasks.trainer.rl_batch import pack_trajectories
from areal_tasks.trainer.sft_data import pack_transcripts
from tests.unit.engine.vision_helpers import PATCH_DIM, per_sequence, vision_batch

#: five sequences: 2, 0, 1, 3 and 0 images of assorted grids
IMAGES = (((1, 4, 8), (1, 2, 2)), (), ((1, 8, 6),), ((1, 2, 4), (1, 6, 2), (1, 4, 4)), ())


def _tagged_batch() -> dict[str, torch.Tensor]:
    """:data:`IMAGES` with every patch row tagged (sequence, image of the sequence, row of the image)."""
    batch = vision_batch(seed=0, images=IMAGES)
    rows = []
    for seq, grids in enumerate(IMAGES):
        for image, (t, h, w) in enumerate(grids):
            for row in range(t * h * w):
                rows.append([seq, image, row])
    batch["pixel_values"][:, :3] = torch.tensor(rows, dtype=torch.float32)
    batch["seq_ids"] = torch.arange(len(IMAGES))
    return batch


def _assert_images_follow(mb: dict[str, torch.Tensor], original: list[dict[str, torch.Tensor]], seqs: list[int]):
    sequence_lengths(mb)  # a valid packed batch, image keys included
    items = per_sequence(mb)
    for item, seq in zip(items, seqs):
        assert item["input_ids"].tolist() == original[seq]["input_ids"].tolist()
        assert ("image_grid_thw" in item) == ("image_grid_thw" in original[seq])
        if "image_grid_thw" in item:
            assert torch.equal(item["image_grid_thw"], original[seq]["image_grid_thw"])
            assert torch.equal(item["pixel_values"], original[seq]["pixel_values"])
            assert set(item["pixel_values"][:, 0].tolist()) == {float(seq)}
    for dummy in items[len(seqs) :]:  # alignment padding: no image
        assert "image_grid_thw" not in dummy


@pytest.mark.parametrize(
    "spec",
    [
        MicroBatchSpec(n_mbs=2),
        MicroBatchSpec(n_mbs=3, packing="kk"),
        MicroBatchSpec(max_tokens_per_mb=40, pad_to_multiple_of=8),
        MicroBatchSpec(n_mbs=7),  # more micro-batches than sequences: two dummy micro-batches
    ],
    ids=["ffd2", "kk3", "cap40-pad8", "dummies"],
)
def test_micro_batches_keep_each_sequences_images(spec):
    batch = _tagged_batch()
    original = per_sequence(batch)
    plan = split_into_micro_batches(batch, spec)
    assert sorted(i for part in plan.indices for i in part) == list(range(len(IMAGES)))
    for mb, seqs in zip(plan.micro_batches, plan.indices):
        assert mb["seq_ids"][: len(seqs)].tolist() == seqs
        _assert_images_follow(mb, original, seqs)
        if not seqs:
            assert mb["pixel_values"].shape == (0, PATCH_DIM) and mb["image_grid_thw"].shape == (0, 3)
    n_images = sum(int(mb["image_grid_thw"].shape[0]) for mb in plan.micro_batches)
    assert n_images == batch["image_grid_thw"].shape[0]
    # per-token outputs merge back into the batch order
    merged = plan.merge([mb["input_ids"].float() for mb in plan.micro_batches])
    assert torch.equal(merged, batch["input_ids"].float())


def test_data_parallel_shares_and_reordered_selections_keep_the_images():
    batch = _tagged_batch()
    original = per_sequence(batch)
    for share in dp_split(batch, 2):
        _assert_images_follow(share, original, share["seq_ids"].tolist())
    order = [3, 0, 4, 2]
    _assert_images_follow(select_sequences(batch, order), original, order)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.pop("image_grid_thw"), "needs all of"),
        (lambda b: b.update(seq_n_images=torch.tensor([2, 0, 1, 2, 0])), "counts 5 images"),
        (lambda b: b.update(pixel_values=b["pixel_values"][:-1]), "sum of prod"),
        (lambda b: b.update(image_grid_thw=b["image_grid_thw"][:, :2]), r"\[N, 3\]"),
    ],
    ids=["missing-key", "count", "pixel-rows", "grid-shape"],
)
def test_inconsistent_image_keys_are_refused(change, message):
    batch = _tagged_batch()
    change(batch)
    with pytest.raises(EngineError, match=message):
        sequence_lengths(batch)


def _pixels(*grids: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    grid = torch.tensor(grids, dtype=torch.long)
    return {"pixel_values": torch.randn(int(grid.prod(-1).sum()), PATCH_DIM), "image_grid_thw": grid}


def test_pack_images_concatenates_in_sequence_order():
    first, third = _pixels((1, 2, 2), (1, 4, 4)), _pixels((1, 2, 6))
    packed = pack_images([first, None, third])
    assert packed["seq_n_images"].tolist() == [2, 0, 1]
    assert torch.equal(packed["pixel_values"], torch.cat([first["pixel_values"], third["pixel_values"]]))
    assert packed["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4], [1, 2, 6]]
    assert pack_images([None, None]) == {}
    with pytest.raises(EngineError, match="sequence 1"):
        pack_images([first, {"pixel_values": first["pixel_values"]}])
    with pytest.raises(EngineError, match="sequence 0"):
        pack_images([{**first, "pixel_values": first["pixel_values"][:3]}])


def test_trajectories_and_transcripts_pack_their_images():
    images = [_pixels((1, 2, 2)), None]
    trajs = [
        Trajectory(
            input_ids=[1, 2, 3, 4],
            loss_mask=[0, 0, 1, 1],
            logprobs=[0.0, 0.0, -1.0, -1.0],
            versions=[-1, -1, 0, 0],
            prompt_len=2,
            reward=1.0,
            multimodal=item,
        )
        for item in images
    ]
    batch = pack_trajectories(trajs, group_size=2, policy_version=0)
    assert batch["seq_n_images"].tolist() == [1, 0]
    assert torch.equal(batch["pixel_values"], images[0]["pixel_values"])
    sequence_lengths(batch)
    text_only = pack_trajectories([Trajectory(**{**t.__dict__, "multimodal": None}) for t in trajs], 2, 0)
    assert "pixel_values" not in text_only and "seq_n_images" not in text_only
    with pytest.raises(AlgorithmError, match="images"):
        pack_trajectories([Trajectory(**{**trajs[0].__dict__, "multimodal": {"pixel_values": torch.zeros(1)}})], 1, 0)

    sft = pack_transcripts([([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1])], images=images)
    assert sft["seq_n_images"].tolist() == [1, 0] and sft["image_grid_thw"].tolist() == [[1, 2, 2]]
    assert "pixel_values" not in pack_transcripts([([1, 2, 3], [0, 1, 1])])
    with pytest.raises(ConfigError, match="images for 1 transcripts"):
        pack_transcripts([([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1])], images=images[:1])


def test_the_fsdp_backend_refuses_what_a_vlm_cannot_run_before_a_job_starts(tiny_qwen2_vl):
    import json

    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.parallel.mesh import ParallelDims
    from areal_tasks.engine.registry import model_problems

    config = json.loads((tiny_qwen2_vl / "config.json").read_text())
    assert model_problems("fsdp", config, ParallelDims(dp=4), EngineConfig()) == []
    problems = model_problems("fsdp", config, ParallelDims(dp=1, tp=2, sp=2), EngineConfig(value_head=True))
    assert [p.split(" (")[0] for p in problems] == ["t2", "c2", "a value head"]
    assert model_problems("fsdp", {"model_type": "qwen2"}, ParallelDims(dp=1, tp=2), EngineConfig()) == []
    llava = model_problems("fsdp", {"model_type": "llava", "vision_config": {}}, ParallelDims(dp=1), EngineConfig())
    assert llava and "qwen2_vl" in llava[0]
