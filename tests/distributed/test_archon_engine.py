"""The archon engine at every parallel layout against the single-process transformers model (fp32,
gloo): per-token log-probs and entropy, the loss, every gradient, the global gradient norm and the
weights after one AdamW step. Dense layouts run a qwen3 model (per-head q/k norms: tensor
parallelism's partial gradients), expert layouts the MoE families."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import ATOL, RTOL, make_batch, reference_logprobs, token_mean_loss
from launch import run_workers

LR = 1e-3

#: tiny models other than the kit's default shape, by test name
TIED = {"tie_word_embeddings": True}

LAYOUTS = [
    ("qwen3", {"dp": 2}, {}),
    ("qwen3", {"tp": 2}, {}),
    ("qwen3", {"sp": 2}, {}),
    ("qwen3", {"pp": 2}, {}),
    ("qwen3", {"pp": 2}, {"pp_schedule": "interleaved_1f1b"}),
    ("qwen3_moe", {"dp": 2, "ep": 2}, {}),
    ("mixtral", {"dp": 2, "ep": 2}, {}),
    ("qwen2_moe", {"pp": 2}, {}),
    ("qwen3", {"pp": 2, "dp": 2}, {}),
    ("qwen3", {"tp": 2, "pp": 2}, {}),
    ("qwen3_moe", {"dp": 4, "ep": 2}, {}),
    ("qwen2-tied", {"pp": 2}, {}),
    ("qwen2-tied", {"pp": 2}, {"pp_schedule": "interleaved_1f1b"}),
    ("qwen3_moe-recompute", {"dp": 2, "ep": 2}, {}),
    ("qwen3_moe", {"dp": 2, "tp": 2, "ep": 2}, {}),
    ("qwen3_moe", {"dp": 2, "pp": 2, "ep": 2}, {}),
    ("qwen3", {"pp": 2, "sp": 2}, {}),
    ("qwen3_moe", {"sp": 2, "ep": 2}, {}),
    ("qwen3-recompute", {"pp": 2}, {}),
]


def _model(factory, family: str):
    base, _, variant = family.partition("-")
    return factory(base, num_hidden_layers=4, **(TIED if variant == "tied" else {}))


def _options(family: str) -> dict:
    """Engine options a test name asks for (``-recompute``: activation checkpointing)."""
    return {"gradient_checkpointing": True} if family.endswith("-recompute") else {}


def _world(dims: dict) -> int:
    return dims.get("dp", 1) * dims.get("tp", 1) * dims.get("sp", 1) * dims.get("pp", 1)


def _hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")


def _disk_names(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, tensors)


def reference(model_dir) -> dict:
    """Loss, gradients (HF on-disk names), grad norm, log-probs and the weights after one AdamW step."""
    model = _hf(model_dir)
    batch = make_batch(seed=0)
    lp = reference_logprobs(model, batch)
    loss, _ = token_mean_loss({"logprobs": lp}, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01).step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {
        "loss": float(loss.detach()),
        "grads": _disk_names(model, grads),
        "norm": float(norm),
        "logprobs": lp.detach(),
        "params": _disk_names(model, params),
    }


def _merged(tmp_path, world: int) -> tuple[dict, list[dict]]:
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    grads: dict[str, torch.Tensor] = {}
    for result in results:
        grads.update(result["grads"])
    return grads, results


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("family", "dims", "archon"),
    LAYOUTS,
    ids=[
        f"{f}-{'-'.join(f'{k}{v}' for k, v in d.items())}{'-' + a['pp_schedule'] if a else ''}" for f, d, a in LAYOUTS
    ],
)
def test_layout_matches_transformers(family, dims, archon, tiny_model_factory, tmp_path):
    model_dir = _model(tiny_model_factory, family)
    world = _world(dims)
    args = {"model_dir": str(model_dir), "dims": dims, "archon": archon, "options": _options(family)}
    run_workers("workers_archon:layout_run", world, tmp_path, args)
    ref = reference(model_dir)
    grads, results = _merged(tmp_path, world)
    assert set(grads) == set(ref["grads"]), sorted(set(grads) ^ set(ref["grads"]))
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(grads[name], grad, atol=ATOL, rtol=RTOL, msg=lambda m, n=name: f"grad {n}: {m}")
    for result in results:  # every rank reports the same step, whatever its stage or shard
        assert result["stats"]["loss"] == pytest.approx(ref["loss"], abs=ATOL)
        assert result["norm"] == pytest.approx(ref["norm"], rel=RTOL)
        torch.testing.assert_close(result["forward"]["logprobs"], ref["logprobs"], atol=ATOL, rtol=RTOL)
        assert result["step"]["loss"] == pytest.approx(ref["loss"], abs=ATOL)
    params = results[0]["params"]
    assert set(params) == set(ref["params"])
    for name, value in ref["params"].items():
        # AdamW divides by the root of the second moment: a gradient near 0 turns fp32 noise into a
        # visible fraction of the 1e-3 step, hence a looser absolute tolerance than the gradients'
        torch.testing.assert_close(params[name], value, atol=5e-5, rtol=RTOL, msg=lambda m, n=name: f"param {n}: {m}")


RESHARDS = [
    ("qwen3", {"pp": 2}, {"dp": 2}),
    ("qwen2-tied", {"pp": 2}, {"dp": 2}),
    ("qwen2-tied", {"dp": 2}, {"pp": 2}),
    ("qwen3", {"dp": 2}, {"tp": 2}),
    ("qwen3_moe", {"dp": 2, "ep": 2}, {"pp": 2}),
]


@pytest.mark.distributed
@pytest.mark.parametrize(("family", "saved_at", "loaded_at"), RESHARDS)
def test_a_checkpoint_reshards_to_another_layout(family, saved_at, loaded_at, tiny_model_factory, tmp_path):
    """Saved after two steps at one layout, loaded at another: every parameter, every AdamW moment
    and step count, and the version are exactly the saved ones, and the next step's loss equals the
    one the saving layout computes."""
    model_dir = str(_model(tiny_model_factory, family))
    args = {"model_dir": model_dir}
    run_workers("workers_archon:reshard_save", _world(saved_at), tmp_path, {**args, "dims": saved_at})
    run_workers("workers_archon:reshard_load", _world(loaded_at), tmp_path, {**args, "dims": loaded_at})
    saved: dict[str, torch.Tensor] = {}
    for r in range(_world(saved_at)):
        saved.update(torch.load(tmp_path / f"saved_rank{r}.pt", weights_only=False))
    loaded: dict[str, torch.Tensor] = {}
    for r in range(_world(loaded_at)):
        loaded.update(torch.load(tmp_path / f"loaded_rank{r}.pt", weights_only=False))
    assert float(loaded.pop("version")) == 2.0
    loaded.pop("next_loss")
    assert set(loaded) == set(saved), sorted(set(loaded) ^ set(saved))
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key


def critic_reference(model_dir) -> dict:
    """The value loss, its gradients and the values of the single-process token-classification critic."""
    from engine_helpers import sequences, value_loss

    from areal_tasks.models.critic import load_critic

    model = load_critic(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    batch = make_batch(seed=0)
    values = []
    for ids in sequences(batch):  # the value of token t is the head on the state after token t - 1
        per_position = model(input_ids=ids[None]).logits.reshape(-1).float()
        values.append(torch.cat([per_position.new_zeros(1), per_position[:-1]]))
    values = torch.cat(values)
    loss, _ = value_loss({"values": values}, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": float(loss.detach()), "grads": grads, "values": values.detach()}


@pytest.mark.distributed
@pytest.mark.parametrize("dims", [{"dp": 2}, {"pp": 2}], ids=["dp2", "pp2"])
def test_a_critic_matches_the_token_classification_model(dims, tiny_model_factory, tmp_path):
    model_dir = tiny_model_factory("qwen3", num_hidden_layers=4)
    world = _world(dims)
    run_workers(
        "workers_archon:layout_run", world, tmp_path, {"model_dir": str(model_dir), "dims": dims, "critic": True}
    )
    ref = critic_reference(model_dir)
    grads, results = _merged(tmp_path, world)
    assert set(grads) == set(ref["grads"]), sorted(set(grads) ^ set(ref["grads"]))
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(grads[name], grad, atol=ATOL, rtol=RTOL, msg=lambda m, n=name: f"grad {n}: {m}")
    for result in results:
        assert result["stats"]["loss"] == pytest.approx(ref["loss"], abs=ATOL)
        torch.testing.assert_close(result["forward"]["values"], ref["values"], atol=ATOL, rtol=RTOL)


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("family", "dims"),
    [("qwen3_moe", {"dp": 2, "ep": 2}), ("qwen2-tied", {"pp": 2}), ("mixtral", {"pp": 2})],
    ids=["qwen3_moe-d2e2", "qwen2-tied-p2", "mixtral-p2"],
)
def test_the_hf_export_is_the_checkpoint_it_was_built_from(family, dims, tiny_model_factory, tmp_path):
    """Exported from sharded stages and experts, the HF directory holds exactly the source
    checkpoint's tensors under its names (per-expert, no LM head when tied), loads in plain
    transformers, and survives a load back into the engine."""
    from transformers import AutoModelForCausalLM

    from areal_tasks.models.safetensors_dir import read_safetensors_dir

    model_dir = _model(tiny_model_factory, family)
    run_workers("workers_archon:export_run", _world(dims), tmp_path, {"model_dir": str(model_dir), "dims": dims})
    source = read_safetensors_dir(model_dir)
    for exported in (tmp_path / "hf", tmp_path / "hf_again"):
        tensors = read_safetensors_dir(exported)
        assert set(tensors) == set(source), sorted(set(tensors) ^ set(source))
        for name, tensor in source.items():
            assert torch.equal(tensors[name], tensor), name
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
