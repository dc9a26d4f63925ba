"""The reward registry: names, import-path specs and the errors for bad specs."""

from __future__ import annotations

import pytest
import reward_helpers

from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards import register_reward, registered_name, resolve_reward, reward_names
from areal_tasks.rollout.rewards import registry as registry_module


def test_builtin_names_are_registered() -> None:
    assert {"exact_match", "numeric", "arithmetic", "math_verify"} <= set(reward_names())
    assert reward_names() == sorted(reward_names())


def test_unknown_name_lists_the_names_and_the_import_path_form() -> None:
    with pytest.raises(RewardError) as info:
        resolve_reward("exactmatch")
    message = str(info.value)
    assert "'exactmatch'" in message and "exact_match" in message and "numeric" in message
    assert "package.module:function" in message


@pytest.mark.parametrize("spec", ["reward_helpers:crash", "reward_helpers.crash", " reward_helpers:crash "])
def test_import_path_specs(spec: str) -> None:
    assert resolve_reward(spec) is reward_helpers.crash


def test_import_path_to_a_builtin_module() -> None:
    from areal_tasks.rollout.rewards.builtin import numeric

    assert resolve_reward("areal_tasks.rollout.rewards.builtin:numeric") is numeric


def test_missing_module_names_the_module_and_the_import_error() -> None:
    with pytest.raises(RewardError, match="cannot import module 'no_such_pkg.rewards'.*No module named"):
        resolve_reward("no_such_pkg.rewards:score")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("reward_helpers:nope", "has no attribute 'nope'"),
        ("reward_helpers:NOT_CALLABLE", "is a int, not a callable"),
        (":crash", "not an import path"),
        ("", "non-empty string"),
    ],
)
def test_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(RewardError, match=match):
        resolve_reward(spec)


def test_register_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    assert register_reward("helper_pid")(reward_helpers.pid) is reward_helpers.pid
    assert resolve_reward("helper_pid") is reward_helpers.pid
    assert registered_name(reward_helpers.pid) == "helper_pid"
    assert register_reward("helper_pid")(reward_helpers.pid) is reward_helpers.pid  # same function again: fine
    with pytest.raises(RewardError, match="already registered"):
        register_reward("helper_pid")(reward_helpers.crash)
    for bad in ("", "a.b", "a:b"):
        with pytest.raises(RewardError, match="non-empty word"):
            register_reward(bad)
