"""A disk update in a MoE checkpoint's per-expert names loads into the embedded server's model,
whose transformers 5 modules hold the experts stacked (``experts.gate_up_proj``/``down_proj``):
the fold gives exactly the tensors ``from_pretrained`` made of the same checkpoint, and an update
missing an expert still fails the served-model check (before this, every per-expert update of a
MoE model failed with "the checkpoint lacks ... experts.gate_up_proj")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from areal_tasks.errors import WeightTransportError
from areal_tasks.models import build_tiny_model
from areal_tasks.weights.base import ServedWeights
from areal_tasks.weights.disk import load_safetensors_dir
from areal_tasks.weights.expert_fold import ExpertFold, fold_expert_tensors


def served_model(model_dir: str) -> tuple[torch.nn.Module, ServedWeights]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    specs = {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}
    return model, ServedWeights(specs, {n for n, _ in model.named_parameters()})


@pytest.fixture(scope="module")
def moe_dir() -> str:
    return str(build_tiny_model("qwen3_moe"))


def test_a_per_expert_checkpoint_loads_as_from_pretrained_stacks_it(moe_dir: str) -> None:
    model, served = served_model(moe_dir)
    stored = load_file(str(Path(moe_dir) / "model.safetensors"))
    assert any(".experts.0.gate_proj.weight" in n for n in stored)  # the checkpoint's own names
    got = load_safetensors_dir(moe_dir, served, torch.device("cpu"))
    expected = model.state_dict()
    assert any(n.endswith("experts.gate_up_proj") for n in got)
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_an_update_missing_an_expert_is_refused(moe_dir: str, tmp_path: Path) -> None:
    _, served = served_model(moe_dir)
    stored = load_file(str(Path(moe_dir) / "model.safetensors"))
    dropped = {n: t for n, t in stored.items() if ".experts.3." not in n}
    save_file(dropped, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightTransportError, match=r"served model has 4 experts, the update has \[0, 1, 2\]"):
        load_safetensors_dir(tmp_path, served, torch.device("cpu"))
    # without any expert nothing is folded: the served-model check names the stacked weights
    no_experts = {n: t for n, t in stored.items() if ".experts." not in n}
    save_file(no_experts, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightTransportError, match=r"lacks 4 weights.*experts\.down_proj"):
        load_safetensors_dir(tmp_path, served, torch.device("cpu"))


def test_stacked_names_and_dense_models_pass_through_unchanged() -> None:
    specs = {"m.experts.gate_up_proj": ((2, 4, 3), torch.float32), "w": ((2,), torch.float32)}
    named = {"m.experts.gate_up_proj": torch.zeros(2, 4, 3), "w": torch.ones(2)}
    assert fold_expert_tensors(named, specs).keys() == named.keys()


def test_a_mixtral_checkpoint_loads_as_from_pretrained_renames_and_stacks_it(tmp_path: Path) -> None:
    """mixtral: ``block_sparse_moe.experts.E.w1/w3/w2`` fold into ``mlp.experts.*`` and the router
    ``block_sparse_moe.gate`` is renamed ``mlp.gate``, as transformers does."""
    mixtral = str(build_tiny_model("mixtral"))
    model, served = served_model(mixtral)
    got = load_safetensors_dir(mixtral, served, torch.device("cpu"))
    expected = model.state_dict()
    assert set(got) == served.required
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def _parts(n_experts: int, inter: int = 3, hidden: int = 2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    named = {}
    for e in range(n_experts):
        for proj, shape in (
            ("gate_proj", (inter, hidden)),
            ("up_proj", (inter, hidden)),
            ("down_proj", (hidden, inter)),
        ):
            named[f"m.experts.{e}.{proj}.weight"] = torch.randn(*shape, generator=gen)
    return named


_SPECS = {
    "m.experts.gate_up_proj": ((2, 6, 2), torch.float32),
    "m.experts.down_proj": ((2, 2, 3), torch.float32),
    "w": ((2,), torch.float32),
}


def test_the_fold_keeps_a_layers_experts_until_all_have_come() -> None:
    named = _parts(2)
    fold = ExpertFold(_SPECS)
    first = fold.add({"w": torch.ones(2), **{n: t for n, t in named.items() if ".0." in n}})
    assert set(first) == {"w"} and fold.pending == ["m.experts.down_proj", "m.experts.gate_up_proj"]
    second = fold.add({n: t for n, t in named.items() if ".1.down" in n})
    assert set(second) == {"m.experts.down_proj"}
    third = fold.add({n: t for n, t in named.items() if ".1.gate" in n or ".1.up" in n})
    assert set(third) == {"m.experts.gate_up_proj"} and fold.pending == []
    fold.finish()
    gate_up = third["m.experts.gate_up_proj"]
    assert torch.equal(gate_up[1, :3], named["m.experts.1.gate_proj.weight"])
    assert torch.equal(gate_up[1, 3:], named["m.experts.1.up_proj.weight"])
    assert torch.equal(second["m.experts.down_proj"][0], named["m.experts.0.down_proj.weight"])


def test_the_fold_refuses_an_update_ending_incomplete_naming_the_missing_experts() -> None:
    named = _parts(2)
    fold = ExpertFold(_SPECS)
    fold.add({n: t for n, t in named.items() if n != "m.experts.1.up_proj.weight"})
    with pytest.raises(
        WeightTransportError,
        match=r"m\.experts\.gate_up_proj: the served model has 2 experts, the update has \[0\]; "
        r"missing experts 1 \(up_proj\)",
    ):
        fold.finish()
    fold.finish()  # forgotten after the refusal


def test_the_fold_refuses_an_expert_out_of_range_or_given_twice() -> None:
    with pytest.raises(WeightTransportError, match="expert 2 is out of range, the served model has 2 experts"):
        ExpertFold(_SPECS).add({"m.experts.2.down_proj.weight": torch.zeros(2, 3)})
    fold = ExpertFold(_SPECS)
    fold.add({"m.experts.0.down_proj.weight": torch.zeros(2, 3)})
    with pytest.raises(WeightTransportError, match="expert 0 is given twice"):
        fold.add({"m.experts.0.down_proj.weight": torch.zeros(2, 3)})
