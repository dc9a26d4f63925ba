"""Stage placement (``loop``/``v``), stage modules pruned from the full decoder with global parameter
names, and chaining the stage modules in one process equals the full decoder (dense and MoE)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.pipeline.padding import pad_micro_batches, stage_kwargs
from areal_tasks.engine.archon.pipeline.schedule import micro_batch_count, schedule_spec
from areal_tasks.engine.archon.pipeline.split import split_layers
from areal_tasks.engine.archon.pipeline.stages import build_stage_modules, make_plan, stage_rank
from areal_tasks.errors import EngineError
from tests.fixtures.archon_pp_toy import make_toy


def test_loop_and_v_placement():
    assert [stage_rank(s, 2, "loop") for s in range(4)] == [0, 1, 0, 1]
    assert [stage_rank(s, 4, "v") for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    plan = make_plan(split_layers([1.0] * 8, 4), 2, "v")
    assert plan.stages_of(0) == [0, 3] and plan.stages_of(1) == [1, 2]
    assert plan.last_rank == 0
    assert make_plan(split_layers([1.0] * 8, 4), 2, "loop").last_rank == 1


def test_plan_validation():
    with pytest.raises(EngineError, match="evenly"):
        make_plan(split_layers([1.0] * 6, 3), 2)
    with pytest.raises(EngineError, match="even number"):
        make_plan(split_layers([1.0] * 6, 3), 1, "v")
    with pytest.raises(EngineError, match="contiguous"):
        make_plan([range(2), range(3, 4)], 2)


def test_schedule_names_and_stage_counts():
    assert schedule_spec("1f1b", 1).single
    assert schedule_spec("zbv", 2).placement == "v"
    with pytest.raises(EngineError, match="unknown pipeline schedule"):
        schedule_spec("pipedream")
    with pytest.raises(EngineError, match="one stage per rank"):
        schedule_spec("gpipe", 2)
    with pytest.raises(EngineError, match="stages_per_rank=2"):
        schedule_spec("zbv", 4)
    with pytest.raises(EngineError, match=">= 2"):
        schedule_spec("interleaved_1f1b", 1)
    assert micro_batch_count("gpipe", 1, 2, 2) == 1
    assert micro_batch_count("1f1b", 1, 2, 2) == 2
    assert micro_batch_count("zbv", 2, 2, 4) == 3
    assert micro_batch_count("interleaved_1f1b", 5, 2, 4) == 6
    assert micro_batch_count("interleaved_1f1b", 3, 4, 8) == 3


def test_stage_modules_keep_global_names_and_only_their_parts():
    model = make_toy(n_layers=6)
    plan = make_plan(split_layers([1.0] * 6, 4), 2, "loop")
    names = {n for n, _ in model.named_parameters()}
    seen: set[str] = set()
    for rank in range(2):
        for stage, module in build_stage_modules(model, plan, rank):
            own = {n for n, _ in module.named_parameters()}
            assert own <= names
            assert not own & seen
            seen |= own
            layer_ids = {int(n.split(".")[1]) for n in own if n.startswith("layers.")}
            assert layer_ids == set(plan.layer_ranges[stage])
            assert (module.embed_tokens is not None) == (stage == 0)
            assert (module.lm_head is not None) == (stage == 3) and (module.norm is not None) == (stage == 3)
    assert seen == names
    assert len(model.layers) == 6  # the full model is untouched


@pytest.mark.parametrize("n_experts", [0, 3])
def test_chained_stages_equal_the_full_model(n_experts):
    model = make_toy(n_layers=4, n_experts=n_experts)
    plan = make_plan(split_layers([1.0] * 4, 4), 2, "v")
    modules = dict(m for r in range(2) for m in build_stage_modules(model, plan, r))
    ids = torch.randint(0, 64, (11,))
    mb = {"input_ids": ids, "cu_seqlens": torch.tensor([0, 4, 11], dtype=torch.int32)}
    (p,) = pad_micro_batches([mb], 1, 16, torch.device("cpu"))
    x, aux = p.input_ids.unsqueeze(0), None
    for stage in range(4):
        kw = stage_kwargs(p, is_last=stage == 3, moe=bool(n_experts), role="actor", temperature=1.0, aux=aux)
        out = modules[stage](x, **kw)
        x, aux = out if n_experts else (out, None)
    ref_kw = stage_kwargs(p, is_last=True, moe=bool(n_experts), role="actor", temperature=1.0)
    ref = model(p.input_ids.unsqueeze(0), **ref_kw)
    ref_out, ref_aux = ref if n_experts else (ref, None)
    torch.testing.assert_close(x, ref_out, atol=0, rtol=0)
    if n_experts:
        torch.testing.assert_close(aux, ref_aux, atol=0, rtol=0)
        assert float(aux[0].detach().sum()) == 11 * 4  # real tokens only, one count per token and layer
    # padding does not change the real tokens' outputs
    unpadded = model(
        ids.unsqueeze(0),
        position_ids=p.position_ids[:, :11],
        cu_seqlens=mb["cu_seqlens"],
        bounds=(0, 4, 11),
        labels=p.labels[:, :11],
    )
    unpadded = unpadded[0] if n_experts else unpadded
    torch.testing.assert_close(x[:, :11], unpadded, atol=1e-6, rtol=1e-6)
