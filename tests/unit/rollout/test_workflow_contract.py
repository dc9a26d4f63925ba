"""The contract every workflow registered in ``areal_tasks.rollout.workflows.WORKFLOWS`` must keep.

Each registered workflow (so a new one is covered by registering it) runs scripted episodes against
a fake InferenceEngine, with a character-level fake tokenizer and the tiny kit's real one, and must:
return a valid Trajectory (None only when nothing was generated); train exactly the generated
tokens, with the engine's logprobs and versions (mixed versions included); start from the rendered
prompt and extend every request's sequence by its output; keep the built-in reward in [0, 1]; never
ask for more than ``sampling.max_new_tokens`` per turn; and let cancellation and reward errors
propagate; declare its options (``options_class``: a dataclass whose fields are keyword parameters
of the factory, with the same defaults) so the config check knows them. The example workflow of
``docs/workflows.md`` is run through the same checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from pathlib import Path

import pytest

import areal_tasks.rollout.workflows as workflows_pkg
from areal_tasks.api.inference import SamplingParams
from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.datasets.prompts import render_prompt
from areal_tasks.datasets.registry import Record
from areal_tasks.registry import Registry
from areal_tasks.rollout.workflows import WORKFLOWS, WorkflowFactory
from tests.unit.rollout.workflow_fakes import FakeEngine, Reply, arith_reward, generated, tokenizer_by_name

ROOT = Path(__file__).resolve().parents[3]
SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0)
RECORD = Record("What is 2+3?", "5")

SCENARIOS: dict[str, list[Reply]] = {
    "right_first": [Reply("Answer: 5")],
    "wrong_then_right_mixed_versions": [Reply("Answer: 4", versions="mixed"), Reply("Answer: 5")],
    "always_wrong": [Reply("I think Answer: 6", versions="mixed")],
    "four_tokens_mixed": [Reply("abc", versions="mixed")],
    "cut_by_length": [Reply("1 + " * 40, eos=False), Reply("Answer: 5")],
}
TOKENIZERS = ["fake", "tiny"]


NAMES = list(WORKFLOWS.names())


def build(name: str, tokenizer_name: str) -> RolloutWorkflow:
    return WORKFLOWS.get(name)(tokenizer_by_name(tokenizer_name), SAMPLING, arith_reward)


def test_the_registry_lists_workflows() -> None:
    assert {"rlvr", "multi_turn"} <= set(NAMES)
    for name in NAMES:
        assert isinstance(build(name, "fake"), RolloutWorkflow)


@pytest.mark.parametrize("name", NAMES)
def test_options_are_declared_as_keyword_parameters_with_the_same_defaults(name: str) -> None:
    factory = WORKFLOWS.get(name)
    schema = factory.options_class
    assert dataclasses.is_dataclass(schema)
    parameters = inspect.signature(factory).parameters
    for option in dataclasses.fields(schema):
        assert parameters[option.name].kind is inspect.Parameter.KEYWORD_ONLY, option.name
        assert parameters[option.name].default == option.default, option.name
    # the job's options reach every workflow
    assert {"system_prompt", "max_prompt_len"} <= set(parameters)


def check_episode(factory: WorkflowFactory, scenario: str, tokenizer_name: str) -> None:
    """Run one scripted episode of ``factory``'s workflow and check every rule of the contract."""
    tokenizer = tokenizer_by_name(tokenizer_name)
    engine = FakeEngine(tokenizer, SCENARIOS[scenario])
    traj = asyncio.run(factory(tokenizer, SAMPLING, arith_reward).arun_episode(engine, RECORD))

    assert isinstance(traj, Trajectory), f"a well-formed item was rejected ({scenario})"
    assert traj.validate() is traj
    assert engine.requests, "no generation request was made"
    # exactly the generated tokens are trained, with the engine's logprobs and versions
    assert generated(traj.input_ids, traj.loss_mask) == [t for r in engine.responses for t in r.output_ids]
    assert generated(traj.logprobs, traj.loss_mask) == [lp for r in engine.responses for lp in r.output_logprobs]
    assert generated(traj.versions, traj.loss_mask) == [v for r in engine.responses for v in r.output_versions]
    assert all(lp == 0.0 and v == -1 for lp, v, m in zip(traj.logprobs, traj.versions, traj.loss_mask) if not m)
    if scenario == "four_tokens_mixed" and tokenizer_name == "fake":
        assert generated(traj.versions, traj.loss_mask)[:4] == [3, 3, 4, 4]
    # the prompt is the rendered prompt; every request is a prefix that its output extends
    prompt_ids = render_prompt(tokenizer, RECORD.prompt)
    assert traj.input_ids[: traj.prompt_len] == prompt_ids
    assert engine.requests[0].input_ids == prompt_ids
    for req, resp in zip(engine.requests, engine.responses):
        n = len(req.input_ids)
        assert traj.input_ids[:n] == req.input_ids
        assert traj.input_ids[n : n + resp.output_len] == resp.output_ids
        assert req.sampling.max_new_tokens <= SAMPLING.max_new_tokens
    assert 0.0 <= traj.reward <= 1.0
    assert traj.metadata["turns"] == len(engine.requests)


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("name", NAMES)
def test_episode_contract(name: str, scenario: str, tokenizer_name: str) -> None:
    check_episode(WORKFLOWS.get(name), scenario, tokenizer_name)


def test_the_docs_example_workflow_keeps_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs/workflows.md").read_text()
    section = text[text.index("## Writing your own") :]
    code = section[
        section.index("```python\n") + len("```python\n") : section.index("```\n", section.index("```python"))
    ]
    registry = Registry("workflow", {name: WORKFLOWS.get(name) for name in NAMES})
    monkeypatch.setattr(workflows_pkg, "WORKFLOWS", registry)  # the example registers into a copy
    exec(compile(code, "docs/workflows.md", "exec"), {"__name__": "docs_example"})
    (added,) = set(registry.names()) - set(NAMES)
    for scenario in SCENARIOS:
        check_episode(registry.get(added), scenario, "fake")


@pytest.mark.parametrize("name", NAMES)
def test_an_empty_generation_is_rejected(name: str) -> None:
    engine = FakeEngine(tokenizer_by_name("fake"), [Reply("", eos=False)])
    assert asyncio.run(build(name, "fake").arun_episode(engine, RECORD)) is None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gate_call", [0, 1])
def test_cancellation_mid_generation_propagates(name: str, gate_call: int) -> None:
    async def scenario() -> None:
        # a wrong first answer, so multi-turn workflows reach a second call
        engine = FakeEngine(tokenizer_by_name("fake"), [Reply("Answer: 4")], gate_call=gate_call)
        task = asyncio.create_task(build(name, "fake").arun_episode(engine, RECORD))
        waited = asyncio.create_task(engine.waiting.wait())
        await asyncio.wait([task, waited], return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # the workflow finished before the gated call (single-turn)
            waited.cancel()
            assert gate_call > 0 and len(engine.requests) <= gate_call
            return
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(scenario())


@pytest.mark.parametrize("name", NAMES)
def test_cancellation_while_scoring_propagates(name: str) -> None:
    async def scenario() -> None:
        scoring = asyncio.Event()

        async def slow_reward(completion: str, answer: str) -> float:
            scoring.set()
            await asyncio.Event().wait()
            return 0.0

        workflow = WORKFLOWS.get(name)(tokenizer_by_name("fake"), SAMPLING, slow_reward)
        task = asyncio.create_task(
            workflow.arun_episode(FakeEngine(tokenizer_by_name("fake"), [Reply("Answer: 5")]), RECORD)
        )
        await scoring.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


@pytest.mark.parametrize("name", NAMES)
def test_reward_errors_propagate(name: str) -> None:
    async def broken(completion: str, answer: str) -> float:
        raise RuntimeError("reward crashed")

    workflow = WORKFLOWS.get(name)(tokenizer_by_name("fake"), SAMPLING, broken)
    with pytest.raises(RuntimeError, match="reward crashed"):
        asyncio.run(workflow.arun_episode(FakeEngine(tokenizer_by_name("fake"), [Reply("Answer: 5")]), RECORD))
