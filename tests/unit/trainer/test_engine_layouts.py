"""The allocation is the layout: each engine's rank layout comes from its training component's dims
(``d`` -> dp, ``t`` -> tp, ``c`` -> Ulysses sp), the reference and critic from their own colocated
component or else the actor's."""

from __future__ import annotations

import dataclasses

import pytest

from areal_tasks.config import load_config
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.errors import ConfigError
from areal_tasks.trainer.engines import actor_layout, engine_layouts


def _cfg(allocation: str, *extra: str):
    return load_config(None, [f"allocation={allocation}", *extra])


@pytest.mark.parametrize(
    ("allocation", "expected"),
    [
        ("embedded:d1+fsdp:d2", ParallelDims(dp=2)),
        ("embedded:d1+fsdp:d1t2", ParallelDims(dp=1, tp=2)),
        ("embedded:d1+fsdp:d1c2", ParallelDims(dp=1, sp=2)),
        ("embedded:d1+fsdp:d2t2c2", ParallelDims(dp=2, sp=2, tp=2)),
    ],
)
def test_the_actor_runs_its_component_dims(allocation, expected):
    assert actor_layout(_cfg(allocation)) == expected


def test_ref_takes_its_colocated_component_else_the_actors():
    colocated = _cfg("embedded[rollout]:d1+fsdp[actor]:d2|fsdp[ref]:t2", "algorithm.kl_coef=0.1", "ref.backend=fsdp")
    assert engine_layouts(colocated) == {"actor": ParallelDims(dp=2), "ref": ParallelDims(dp=1, tp=2)}
    implicit = _cfg("embedded:d1+fsdp:d1c2", "algorithm.kl_coef=0.1", "ref.backend=fsdp")
    assert engine_layouts(implicit)["ref"] == ParallelDims(dp=1, sp=2)


def test_a_ref_pool_of_another_size_is_refused():
    # validation refuses it first (tests/unit/config/test_validate.py); the builder refuses it too
    valid = _cfg("embedded:d1+fsdp:d2", "algorithm.kl_coef=0.1", "ref.backend=fsdp")
    cfg = dataclasses.replace(valid, allocation="embedded[rollout]:d1+fsdp[actor]:d2+fsdp[ref]:d1")
    with pytest.raises(ConfigError, match="every engine runs on the actor's 2"):
        engine_layouts(cfg)


def test_an_archon_layout_the_model_cannot_run_is_refused_before_anything_starts(tiny_model_factory):
    from areal_tasks.trainer.engines import check_layouts_fit_model

    moe = str(tiny_model_factory("qwen3_moe"))  # 2 layers, 4 experts
    archon = ("actor.backend=archon",)
    check_layouts_fit_model(_cfg("embedded:d1+archon:d4e4", *archon), moe)
    with pytest.raises(ConfigError, match=r"num_experts=4 is not divisible by expert parallelism e8"):
        check_layouts_fit_model(_cfg("embedded:d1+archon:d8e8", *archon), moe)
    with pytest.raises(ConfigError, match=r"num_hidden_layers=2 cannot fill 4 pipeline stages"):
        check_layouts_fit_model(_cfg("embedded:d1+archon:p4", *archon), moe)
    with pytest.raises(ConfigError, match=r"num_key_value_heads=2 is not divisible by tensor parallelism t4"):
        check_layouts_fit_model(_cfg("embedded:d1+archon:t4", *archon), str(tiny_model_factory("qwen3")))
    check_layouts_fit_model(_cfg("embedded:d1+fsdp:d8"), moe)  # fsdp checks nothing here
