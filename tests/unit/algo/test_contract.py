"""The contract every registered Algorithm meets, run once per algorithm.

Built from its default config by name; advantages on a small packed batch (with critic values when
needed); a finite scalar loss with a gradient; the loss-weight contract (1 vs 3 micro-batches give
the same total loss and gradient); a fully masked group and zero-std rewards without NaN; a filter.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from areal_tasks.algo import Algorithm, algorithm_names, build_algorithm
from areal_tasks.api.workflow import Trajectory
from areal_tasks.config.algorithm import AlgorithmConfig

ALL = algorithm_names()


def test_all_seven_algorithms_are_registered_with_configs() -> None:
    expected = {"ppo", "grpo", "dr_grpo", "dapo", "rloo", "reinforce_plus_plus", "gspo"}
    assert set(ALL) == expected
    assert set(AlgorithmConfig.names()) == expected


def _algo_and_batch(name: str, make_batch: Callable, **kw: object) -> tuple[Algorithm, dict]:
    algo = build_algorithm(AlgorithmConfig.variant_class(name)())
    batch = make_batch(**kw)
    if not algo.needs_critic:
        del batch["values"]
    if not algo.needs_ref:
        del batch["ref_logprobs"]
    return algo, algo.compute_advantages(batch)


def _outputs(batch: dict, seed: int = 5) -> dict:
    gen = torch.Generator().manual_seed(seed)
    t = batch["logprobs"].shape[0]
    return {
        "logprobs": (batch["prox_logprobs"] + 0.3 * torch.randn(t, generator=gen)).requires_grad_(True),
        "entropy": torch.rand(t, generator=gen),
        "values": (batch.get("values", torch.zeros(t)) + torch.randn(t, generator=gen)).requires_grad_(True),
    }


@pytest.mark.parametrize("name", ALL)
def test_selectable_by_name_with_its_own_config(name: str) -> None:
    config = AlgorithmConfig.variant_class(name)()
    algo = build_algorithm(config)
    assert algo.config is config and config.name == name
    assert algo.needs_critic == type(config).needs_critic
    assert algo.needs_ref == (config.kl_coef > 0)


@pytest.mark.parametrize("name", ALL)
def test_advantages_loss_and_gradient(name: str, make_batch: Callable) -> None:
    algo, batch = _algo_and_batch(name, make_batch)
    adv, mask = batch["advantages"], batch["loss_mask"]
    assert adv.shape == mask.shape and torch.isfinite(adv).all() and torch.all(adv[~mask] == 0)
    assert adv[mask].abs().sum() > 0
    assert ("returns" in batch) == algo.needs_critic
    outputs = _outputs(batch)
    loss, stats = algo.actor_loss_fn(outputs, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grad = outputs["logprobs"].grad
    assert torch.isfinite(grad).all() and grad[mask].abs().sum() > 0 and torch.all(grad[~mask] == 0)
    assert all(type(v) is float for v in stats.values())
    if algo.needs_critic:
        value_loss, _ = algo.critic_loss_fn(outputs, batch)
        value_loss.backward()
        assert torch.isfinite(outputs["values"].grad).all() and outputs["values"].grad.abs().sum() > 0


@pytest.mark.parametrize("name", ALL)
def test_one_or_three_micro_batches_give_the_same_loss_and_gradient(
    name: str, make_batch: Callable, split: Callable
) -> None:
    algo, batch = _algo_and_batch(name, make_batch)
    fns = [(algo.actor_loss_fn, algo.actor_loss_weight_fn, "logprobs")]
    if algo.needs_critic:
        fns.append((algo.critic_loss_fn, algo.critic_loss_weight_fn, "values"))
    for loss_fn, weight_fn, key in fns:
        outputs = _outputs(batch)
        full, _ = loss_fn(outputs, batch)
        (grad_full,) = torch.autograd.grad(full, outputs[key])
        outputs = _outputs(batch)
        mbs = split({**batch, **{f"out_{k}": v for k, v in outputs.items()}}, [0, 3, 4, 8])
        total_weight = sum(weight_fn(mb) for mb in mbs)
        total = sum(loss_fn({k: mb[f"out_{k}"] for k in outputs}, mb)[0] * weight_fn(mb) / total_weight for mb in mbs)
        (grad_split,) = torch.autograd.grad(total, outputs[key])
        assert total.item() == pytest.approx(full.item(), rel=1e-5, abs=1e-7)
        assert torch.allclose(grad_split, grad_full, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_fully_masked_group_and_zero_std_rewards_stay_finite(name: str, make_batch: Callable) -> None:
    batch = make_batch(rewards=(1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0))
    cu = batch["cu_seqlens"]
    batch["loss_mask"][: int(cu[4])] = False  # group 0 fully masked; group 1 rewards have zero std
    algo = build_algorithm(AlgorithmConfig.variant_class(name)())
    if not algo.needs_ref:
        del batch["ref_logprobs"]
    out = algo.compute_advantages(batch)
    assert torch.isfinite(out["advantages"]).all() and torch.all(out["advantages"][: int(cu[4])] == 0)
    outputs = _outputs(out)
    loss, stats = algo.actor_loss_fn(outputs, out)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(outputs["logprobs"].grad).all()
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    empty = {k: (v[:0] if k not in ("cu_seqlens",) else v[:1]) for k, v in out.items()}
    assert algo.actor_loss_weight_fn(empty) == 0.0


@pytest.mark.parametrize("name", ALL)
def test_group_filter_is_none_or_keeps_an_informative_group(name: str, make_batch: Callable) -> None:
    algo = build_algorithm(AlgorithmConfig.variant_class(name)())
    batch = make_batch(rewards=(1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0))
    keep = algo.group_filter
    if keep is None:  # every group is kept
        return
    groups = [
        [Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], reward=float(r), prompt_len=1) for r in rewards]
        for rewards in (batch["rewards"][:4].tolist(), batch["rewards"][4:].tolist())
    ]
    kept = [keep(group) for group in groups]
    assert all(isinstance(k, bool) for k in kept) and kept[0]
