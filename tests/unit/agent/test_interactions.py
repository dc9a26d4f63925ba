"""The interaction cache: parent links, rewards and their discount (once), and both export styles."""

from __future__ import annotations

import pytest

from areal_tasks.agent.interactions import Interaction, InteractionCache
from areal_tasks.errors import AgentError

USER = {"role": "user", "content": "q"}


def _item(cid: str, prompt: list[int], out: list[int], parent: str | None = None, messages=None) -> Interaction:
    return Interaction(
        id=cid,
        messages=messages if messages is not None else [USER],
        prompt_text="",
        prompt_ids=prompt,
        output_ids=out,
        output_logprobs=[-0.5] * len(out),
        output_versions=[3] * len(out),
        message={"role": "assistant", "content": cid},
        finish_reason="stop",
        parent_id=parent,
    )


def _three_turns() -> InteractionCache:
    cache = InteractionCache()
    cache.add(_item("a", [1, 2], [3, 4]))
    cache.add(_item("b", [1, 2, 3, 4, 9], [5], parent="a"))
    cache.add(_item("c", [1, 2, 3, 4, 9, 5, 9, 9], [6, 7], parent="b"))
    return cache


def test_concat_export_trains_exactly_the_generated_tokens() -> None:
    cache = _three_turns()
    cache.set_last_reward(1.0)
    (traj,) = cache.export("concat")
    assert traj.input_ids == [1, 2, 3, 4, 9, 5, 9, 9, 6, 7]
    assert traj.loss_mask == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert traj.logprobs == [0, 0, -0.5, -0.5, 0, -0.5, 0, 0, -0.5, -0.5]
    assert traj.versions == [-1, -1, 3, 3, -1, 3, -1, -1, 3, 3]
    assert traj.prompt_len == 2 and traj.reward == 1.0
    assert traj.metadata == {"turns": 3, "completion_ids": ["a", "b", "c"], "finish_reasons": ["stop"] * 3}


def test_individual_export_is_one_sample_per_turn() -> None:
    cache = _three_turns()
    cache.set_reward("b", 0.5)
    trajs = cache.export("individual")
    assert [t.prompt_len for t in trajs] == [2, 5, 8]
    assert trajs[1].input_ids == [1, 2, 3, 4, 9, 5] and trajs[1].loss_mask == [0, 0, 0, 0, 0, 1]
    assert [t.reward for t in trajs] == [0.0, 0.5, 0.0]  # unset rewards export as 0, nothing implicit


def test_discount_propagates_leaves_first_and_runs_once() -> None:
    cache = _three_turns()
    cache.set_reward("a", 0.1)
    cache.set_last_reward(1.0)
    cache.apply_discount(0.5)
    assert [cache[c].reward for c in "abc"] == pytest.approx([0.1 + 0.25, 0.5, 1.0])
    with pytest.raises(AgentError, match="once"):
        cache.apply_discount(0.5)
    assert [t.reward for t in cache.export("individual")] == pytest.approx([0.35, 0.5, 1.0])


def test_branches_export_one_conversation_per_leaf() -> None:
    cache = InteractionCache()
    cache.add(_item("a", [1, 2], [3]))
    cache.add(_item("b", [1, 2, 3, 9], [5], parent="a"))
    cache.add(_item("c", [1, 2, 3, 8], [6], parent="a"))
    cache.set_reward("b", 1.0)
    cache.apply_discount(1.0)
    assert cache["a"].reward == pytest.approx(0.5)  # the mean of its children
    trajs = cache.export("concat")
    assert [t.metadata["completion_ids"] for t in trajs] == [["a", "b"], ["a", "c"]]
    assert [t.reward for t in trajs] == [1.0, 0.0]


def test_parent_lookup_takes_the_longest_extended_conversation() -> None:
    cache = InteractionCache()
    first = _item("a", [1], [2])
    cache.add(first)
    later = [USER, first.message, {"role": "user", "content": "more"}]
    second = _item("b", [1, 2, 9], [3], parent="a", messages=later)
    cache.add(second)
    assert cache.parent_of([USER, first.message, {"role": "user", "content": "other"}]) is first
    assert cache.parent_of([*later, second.message, USER]) is second
    assert cache.parent_of([USER]) is None
    assert cache.parent_of([USER, {"role": "assistant", "content": "changed"}, USER]) is None


def test_misuse_raises_agent_error() -> None:
    cache = InteractionCache()
    with pytest.raises(AgentError):
        cache.set_last_reward(1.0)
    with pytest.raises(AgentError):
        cache.set_reward("nope", 1.0)
    with pytest.raises(AgentError, match="parent"):
        cache.add(_item("b", [1], [2], parent="a"))
    cache.add(_item("a", [1], [2]))
    with pytest.raises(AgentError, match="already"):
        cache.add(_item("a", [1], [2]))
    with pytest.raises(AgentError, match="style"):
        cache.export("flat")  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        cache["zzz"]
    assert len(cache) == 1 and [i.id for i in cache] == ["a"] and "a" in cache
