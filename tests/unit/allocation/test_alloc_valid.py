"""Valid allocation specs: GPU totals, component layouts, colocation and the model's helpers."""

from __future__ import annotations

import pytest

from areal_tasks.config.allocation import AllocationMode, ParallelDims, parse_allocation
from areal_tasks.errors import AllocationError

# (spec, total GPUs, canonical text of each component, world size of each component)
VALID = [
    ("sglang:d2+fsdp:d4", 6, ["sglang:d2", "fsdp:d4"], [2, 4]),
    ("fsdp:d8", 8, ["fsdp:d8"], [8]),
    ("sglang:d4", 4, ["sglang:d4"], [4]),
    ("embedded:d1+fsdp:d1", 2, ["embedded:d1", "fsdp:d1"], [1, 1]),
    ("vllm:t2d2+fsdp:c2d2", 8, ["vllm:d2t2", "fsdp:d2c2"], [4, 4]),
    ("sglang:p2t2d2+megatron:p2t2d2c2", 24, ["sglang:d2t2p2", "megatron:d2t2p2c2"], [8, 16]),
    ("sglang:d1t1p1+fsdp:d1t1c1", 2, ["sglang:d1", "fsdp:d1"], [1, 1]),
    ("megatron:d4e2", 4, ["megatron:d4e2"], [4]),
    ("megatron:d2c2e4", 4, ["megatron:d2c2e4"], [4]),
    ("archon:d4t2e4", 8, ["archon:d4t2e4"], [8]),
    ("sglang[rollout]:d4|fsdp[actor]:d4", 4, ["sglang[rollout]:d4", "fsdp[actor]:d4"], [4, 4]),
    ("sglang[rollout]:d2t2|fsdp[actor]:d4", 4, ["sglang[rollout]:d2t2", "fsdp[actor]:d4"], [4, 4]),
    ("fsdp[actor]:d4|fsdp[ref]:t4", 4, ["fsdp[actor]:d4", "fsdp[ref]:t4"], [4, 4]),
    (
        "sglang[rollout]:d4+fsdp[actor]:d4|fsdp[ref]:d4",
        8,
        ["sglang[rollout]:d4", "fsdp[actor]:d4", "fsdp[ref]:d4"],
        [4, 4, 4],
    ),
    (
        "sglang[gen]:d2+vllm[judge]:t2+fsdp[actor]:d4",
        8,
        ["sglang[gen]:d2", "vllm[judge]:t2", "fsdp[actor]:d4"],
        [2, 2, 4],
    ),
    ("megatron:(attn:d4p2t2c2|ffn:d2p2t4e2)", 32, ["megatron:(attn:d4t2p2c2|ffn:d2t4p2e2)"], [32]),
    ("megatron:(ffn:d2p2e2|attn:d4p2)", 8, ["megatron:(attn:d4p2|ffn:d2p2e2)"], [8]),
    ("archon:(attn:d8|ffn:e8)", 8, ["archon:(attn:d8|ffn:e8)"], [8]),
    (
        "sglang:d8+megatron[actor]:(attn:d4p2|ffn:d1p2e4)",
        16,
        ["sglang:d8", "megatron[actor]:(attn:d4p2|ffn:p2e4)"],
        [8, 8],
    ),
    ("sglang:d2 + fsdp:d4", 6, ["sglang:d2", "fsdp:d4"], [2, 4]),
    ("  sglang[a]:d2 |  fsdp[b]:d2 + fsdp[c]:d1 ", 3, ["sglang[a]:d2", "fsdp[b]:d2", "fsdp[c]:d1"], [2, 2, 1]),
    ("sglang[my-rollout_2]:d2+fsdp:d2", 4, ["sglang[my-rollout_2]:d2", "fsdp:d2"], [2, 2]),
    ("fsdp:d04", 4, ["fsdp:d4"], [4]),
]


@pytest.mark.parametrize(("spec", "total", "texts", "worlds"), VALID, ids=[v[0] for v in VALID])
def test_valid_specs(spec: str, total: int, texts: list[str], worlds: list[int]) -> None:
    mode = parse_allocation(spec)
    assert mode.spec == spec
    assert mode.total_gpus == total
    assert [c.to_spec() for c in mode.components] == texts
    assert [c.world_size for c in mode.components] == worlds


def test_dims_in_any_order_and_omitted_dims_are_one() -> None:
    comp = parse_allocation("megatron:e2c2p3t4d5").components[0]
    assert comp.dims == ParallelDims(d=5, t=4, p=3, c=2, e=2)
    assert comp.world_size == 5 * 4 * 3 * 2
    assert parse_allocation("fsdp:t2").components[0].dims == ParallelDims(t=2)


def test_expert_dim_adds_no_gpus() -> None:
    assert parse_allocation("megatron:d4").total_gpus == parse_allocation("megatron:d4e4").total_gpus == 4


def test_kinds_and_helpers() -> None:
    mode = parse_allocation("sglang[gen]:d2+vllm[judge]:d2+fsdp[ref]:d2+fsdp[actor]:d4")
    assert [c.kind for c in mode.components] == ["inference", "inference", "training", "training"]
    assert [c.name for c in mode.inference()] == ["gen", "judge"]
    assert [c.name for c in mode.training()] == ["ref", "actor"]
    assert mode.actor().name == "actor"
    assert mode.get("judge").backend == "vllm"


def test_actor_falls_back_to_unnamed_then_first_training() -> None:
    assert parse_allocation("sglang:d2+fsdp:d4").actor().backend == "fsdp"
    assert parse_allocation("fsdp[ref]:d2+megatron:d4").actor().backend == "megatron"
    assert parse_allocation("fsdp[critic]:d2+megatron[ref]:d4").actor().name == "critic"


def test_actor_without_training_component_fails() -> None:
    with pytest.raises(AllocationError, match="no training component"):
        parse_allocation("sglang:d4").actor()


def test_get_unknown_name_lists_known_names() -> None:
    mode = parse_allocation("sglang[rollout]:d2+fsdp[actor]:d2")
    with pytest.raises(AllocationError, match="no component named 'critic'") as info:
        mode.get("critic")
    assert "actor, rollout" in info.value.hint


def test_colocated_with_names_the_other_members() -> None:
    mode = parse_allocation("sglang[rollout]:d4|fsdp[actor]:d4|fsdp[ref]:d4+fsdp[critic]:d2")
    assert mode.get("rollout").colocated_with == ("actor", "ref")
    assert mode.get("actor").colocated_with == ("rollout", "ref")
    assert mode.get("critic").colocated_with == ()
    assert mode.total_gpus == 6


def test_hybrid_component_exposes_both_layouts() -> None:
    comp = parse_allocation("megatron:(attn:d4p2t2c2|ffn:d2p2t4e2)").components[0]
    assert comp.hybrid is not None
    assert comp.dims == comp.hybrid.attn == ParallelDims(d=4, t=2, p=2, c=2)
    assert comp.hybrid.ffn == ParallelDims(d=2, t=4, p=2, e=2)
    assert comp.hybrid.ffn_world_size == comp.world_size == 32


def test_to_dict_shape() -> None:
    data = parse_allocation("sglang[rollout]:d2|megatron[actor]:(attn:d2|ffn:e2)").to_dict()
    assert data["spec"] == "sglang[rollout]:d2|megatron[actor]:(attn:d2|ffn:e2)"
    assert data["total_gpus"] == 2
    rollout, actor = data["components"]
    assert rollout == {
        "backend": "sglang",
        "kind": "inference",
        "name": "rollout",
        "world_size": 2,
        "dims": {"d": 2, "t": 1, "p": 1, "c": 1, "e": 1},
        "colocated_with": ["actor"],
        "hybrid": None,
    }
    assert actor["dims"] == actor["hybrid"]["attn"] == {"d": 2, "t": 1, "p": 1, "c": 1, "e": 1}
    assert actor["hybrid"]["ffn"] == {"d": 1, "t": 1, "p": 1, "c": 1, "e": 2}
    plain = parse_allocation("sglang:d2+fsdp:d1").to_dict()["components"][1]
    assert plain["name"] is None and plain["colocated_with"] == [] and plain["kind"] == "training"


@pytest.mark.parametrize(("spec", "gpus"), [("sglang:d2+fsdp:d4", 6), ("sglang:d2+fsdp:d4", 8), ("fsdp:d1", 1)])
def test_fits_cluster(spec: str, gpus: int) -> None:
    mode = parse_allocation(spec, total_gpus=gpus)
    assert isinstance(mode, AllocationMode)
    assert mode.total_gpus == parse_allocation(spec).total_gpus


def test_parallel_dims_rejects_non_positive_values() -> None:
    with pytest.raises(AllocationError, match="t=0"):
        ParallelDims(t=0)
    with pytest.raises(AllocationError, match="positive integer"):
        ParallelDims(d=True)
    assert ParallelDims().world_size == 1
