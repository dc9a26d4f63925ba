"""RLVRWorkflow specifics: the exact trajectory, rejections, item forms, reward errors, the registry."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_tasks.api.inference import SamplingParams
from areal_tasks.datasets.prompts import render_prompt
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.workflows import MultiTurnWorkflow, RLVRWorkflow, item_fields, make_workflow
from tests.unit.rollout.workflow_fakes import EOS, FakeEngine, FakeTokenizer, Reply, arith_reward

ROOT = Path(__file__).resolve().parents[3]
SAMPLING = SamplingParams(max_new_tokens=16)
RECORD = Record("What is 2+3?", "5")


def run(workflow: RLVRWorkflow, engine: FakeEngine, data: object = RECORD):
    return asyncio.run(workflow.arun_episode(engine, data))


def test_trajectory_is_prompt_plus_output_with_aligned_lists() -> None:
    tok = FakeTokenizer()
    engine = FakeEngine(tok, [Reply("Answer: 5", versions="mixed")])
    traj = run(RLVRWorkflow(tok, SAMPLING, arith_reward), engine)
    prompt = render_prompt(tok, RECORD.prompt)
    resp = engine.responses[0]
    assert resp.output_ids[-1] == EOS
    n, m = len(prompt), resp.output_len
    assert traj.input_ids == prompt + resp.output_ids
    assert traj.loss_mask == [0] * n + [1] * m
    assert traj.logprobs == [0.0] * n + resp.output_logprobs
    assert traj.versions == [-1] * n + resp.output_versions
    assert resp.output_versions[0] == 3 and resp.output_versions[-1] == 4
    assert traj.prompt_len == n and traj.reward == 1.0
    assert traj.metadata == {
        "stop_reason": "stop",
        "completion": "Answer: 5",
        "answer": "5",
        "n_output_tokens": m,
        "latency_s": resp.latency_s,
        "n_resubmits": resp.n_resubmits,
        "turns": 1,
    }
    assert engine.requests[0].sampling == SAMPLING


def test_reward_sees_text_without_special_tokens_and_wrong_answers_score_zero() -> None:
    seen: list[tuple[str, str]] = []

    async def reward(completion: str, answer: str) -> float:
        seen.append((completion, answer))
        return await arith_reward(completion, answer)

    tok = FakeTokenizer()
    traj = run(RLVRWorkflow(tok, SAMPLING, reward), FakeEngine(tok, [Reply("Answer: 4")]))
    assert seen == [("Answer: 4", "5")] and traj.reward == 0.0


def test_too_long_prompt_is_rejected_without_generating(caplog: pytest.LogCaptureFixture) -> None:
    tok = FakeTokenizer()
    n = len(render_prompt(tok, RECORD.prompt))
    engine = FakeEngine(tok, [Reply("Answer: 5")])
    with caplog.at_level(logging.DEBUG, logger="areal_tasks.rollout.workflows"):
        assert run(RLVRWorkflow(tok, SAMPLING, arith_reward, max_prompt_len=n - 1), engine) is None
    assert engine.requests == [] and "max_prompt_len" in caplog.text
    assert run(RLVRWorkflow(tok, SAMPLING, arith_reward, max_prompt_len=n), engine) is not None


def test_empty_output_is_rejected() -> None:
    tok = FakeTokenizer()
    engine = FakeEngine(tok, [Reply("", eos=False)])
    assert run(RLVRWorkflow(tok, SAMPLING, arith_reward), engine) is None
    assert len(engine.requests) == 1


def test_length_cut_output_is_kept() -> None:
    tok = FakeTokenizer()
    traj = run(RLVRWorkflow(tok, SAMPLING, arith_reward), FakeEngine(tok, [Reply("x" * 50, eos=False)]))
    assert traj.n_generated == SAMPLING.max_new_tokens and traj.metadata["stop_reason"] == "length"


def test_reward_errors_propagate() -> None:
    async def broken(completion: str, answer: str) -> float:
        raise ValueError("bad reference")

    tok = FakeTokenizer()
    with pytest.raises(ValueError, match="bad reference"):
        run(RLVRWorkflow(tok, SAMPLING, broken), FakeEngine(tok, [Reply("Answer: 5")]))


def test_system_prompt_none_renders_only_the_user_turn() -> None:
    tok = FakeTokenizer()
    engine = FakeEngine(tok, [Reply("Answer: 5")])
    run(RLVRWorkflow(tok, SAMPLING, arith_reward, system_prompt=None), engine)
    assert (
        tok.decode(engine.requests[0].input_ids) == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_items_may_be_records_objects_or_mappings() -> None:
    assert item_fields(RECORD) == ("What is 2+3?", "5")
    assert item_fields(SimpleNamespace(prompt="p", answer=7)) == ("p", "7")
    assert item_fields({"prompt": "p", "answer": 7, "extra": 1}) == ("p", "7")
    for bad in ({"prompt": "p"}, "text", SimpleNamespace(prompt="p")):
        with pytest.raises(RolloutError, match="prompt and an answer"):
            item_fields(bad)
    tok = FakeTokenizer()
    traj = run(
        RLVRWorkflow(tok, SAMPLING, arith_reward),
        FakeEngine(tok, [Reply("Answer: 5")]),
        {"prompt": RECORD.prompt, "answer": 5},
    )
    assert traj.reward == 1.0 and traj.metadata["answer"] == "5"


def test_invalid_options_are_config_errors() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="max_prompt_len"):
            RLVRWorkflow(FakeTokenizer(), SAMPLING, arith_reward, max_prompt_len=bad)


def test_make_workflow_builds_registered_workflows_with_options() -> None:
    tok = FakeTokenizer()
    assert isinstance(make_workflow("rlvr", tok, SAMPLING, arith_reward), RLVRWorkflow)
    multi = make_workflow("multi_turn", tok, SAMPLING, arith_reward, max_turns=3)
    assert isinstance(multi, MultiTurnWorkflow) and multi.max_turns == 3
    with pytest.raises(ConfigError, match="unknown workflow 'nope'; known: agent, agent_command, multi_turn, rlvr"):
        make_workflow("nope", tok, SAMPLING, arith_reward)


def test_workflows_import_without_torch_or_transformers() -> None:
    code = (
        "import sys, areal_tasks.rollout.workflows\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_a_workflow_by_import_path_and_clear_errors_for_bad_ones() -> None:
    from areal_tasks.errors import ConfigError
    from areal_tasks.rollout.workflows import RLVRWorkflow, resolve_workflow

    assert resolve_workflow("rlvr") is RLVRWorkflow
    assert resolve_workflow("areal_tasks.rollout.workflows.rlvr:RLVRWorkflow") is RLVRWorkflow
    with pytest.raises(ConfigError, match="import path"):
        resolve_workflow("nope")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_workflow("no_such_module_xyz:Factory")
    with pytest.raises(ConfigError, match="no callable"):
        resolve_workflow("areal_tasks.rollout.workflows.rlvr:Missing")


def test_a_chat_record_renders_its_messages_and_the_reward_gets_tests_and_metadata() -> None:
    tok = FakeTokenizer()
    seen: list[dict] = []

    async def reward(completion: str, answer: str, **extras: object) -> float:
        seen.append({"answer": answer, **extras})
        return 1.0

    chat = (
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "2+3?"},
    )
    record = Record("2+3?", "", messages=chat, tests="assert f() == 5", metadata={"source": "unit"})
    workflow = RLVRWorkflow(tok, SAMPLING, reward, system_prompt="Be brief.")
    engine = FakeEngine(tok, [Reply("Answer: 5")])
    traj = run(workflow, engine, record)
    want = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, *chat], add_generation_prompt=True)
    assert engine.requests[0].input_ids == want and traj.prompt_len == len(want)
    assert seen == [{"answer": "", "tests": "assert f() == 5", "metadata": {"source": "unit"}}]
    own_system = ({"role": "system", "content": "You are terse."}, *chat)
    engine = FakeEngine(tok, [Reply("Answer: 5")])
    run(workflow, engine, Record("2+3?", "5", messages=own_system))
    assert engine.requests[0].input_ids == tok.apply_chat_template(list(own_system), add_generation_prompt=True)
    assert seen[-1] == {"answer": "5"}  # no tests, no metadata: no extra keyword arguments


def test_rejections_say_why_to_the_session_trace() -> None:
    from areal_tasks.trace.sessions import EpisodeSession, bind

    tok = FakeTokenizer()
    n = len(render_prompt(tok, RECORD.prompt))

    async def traced(workflow: RLVRWorkflow, engine: FakeEngine) -> str | None:
        session = EpisodeSession("e", "g", [0, 0], 0, 0.0, 0)
        bind(session)  # what the executor does as an episode starts
        assert await workflow.arun_episode(engine, RECORD) is None
        return session.note

    too_long = RLVRWorkflow(tok, SAMPLING, arith_reward, max_prompt_len=n - 1)
    assert asyncio.run(traced(too_long, FakeEngine(tok, [Reply("Answer: 5")]))) == "prompt too long"
    empty = FakeEngine(tok, [Reply("", eos=False)])
    assert asyncio.run(traced(RLVRWorkflow(tok, SAMPLING, arith_reward), empty)) == "empty output"
