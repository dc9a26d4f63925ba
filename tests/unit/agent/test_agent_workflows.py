"""The ``agent`` and ``agent_command`` workflows against a scripted engine (the registry's contract
test covers their defaults; these cover what only agents do).

``agent``: multi-turn tool use becomes one trajectory training exactly the generated tokens; the
reward's precedence (returned number, rewards the agent set, the job's reward function); a slow
agent fails by its timeout; a sync function or a bad path is a ConfigError naming the option; an
agent loaded from a file path. ``agent_command``: the default program (the official SDK, one turn)
trains like ``rlvr``; a program sets its own reward through the proxy; a failing program's stderr is
in the error; a program past its timeout is killed with its children; the program sees neither
the job's secrets nor the item's answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from areal_tasks.agent.command_workflow import AgentCommandWorkflow
from areal_tasks.agent.workflow import AgentWorkflow
from areal_tasks.api.inference import SamplingParams
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import AgentError, ConfigError
from tests.unit.rollout.workflow_fakes import FakeEngine, Reply, arith_reward, generated, tokenizer_by_name

SAMPLING = SamplingParams(max_new_tokens=64, temperature=1.0)
RECORD = Record("What is 2+3?", "5")
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
HERE = Path(__file__).resolve()
#: the import path of this module's agents
AGENTS = "tests.unit.agent.test_agent_workflows"


async def tool_agent(client, data):
    """Call the tool the model asks for, feed the result back, return None (the reward fn scores)."""
    messages = [{"role": "user", "content": data.prompt}]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    for _ in range(3):
        completion = await client.chat.completions.create(model="m", messages=messages, tools=tools)
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return None


async def returns_half(client, data):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data.prompt}])
    return 0.5


async def sets_its_own_reward(client, data):
    completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data.prompt}])
    client.cache.set_reward(completion.id, 0.25)


async def sleeps(client, data):
    await asyncio.sleep(30)


def sync_agent(client, data):
    return 1.0


def run(workflow, engine):
    return asyncio.run(workflow.arun_episode(engine, RECORD))


def agent_workflow(name: str, **options) -> AgentWorkflow:
    return AgentWorkflow(tokenizer_by_name("tiny"), SAMPLING, arith_reward, agent=f"{AGENTS}:{name}", **options)


def test_a_tool_using_conversation_is_one_trajectory_of_the_generated_tokens() -> None:
    engine = FakeEngine(tokenizer_by_name("tiny"), [Reply(TOOL_CALL), Reply("Answer: 5")])
    traj = run(agent_workflow("tool_agent"), engine)
    assert traj is not None and traj.validate() is traj
    assert len(engine.requests) == 2
    assert generated(traj.input_ids, traj.loss_mask) == [t for r in engine.responses for t in r.output_ids]
    assert generated(traj.logprobs, traj.loss_mask) == [lp for r in engine.responses for lp in r.output_logprobs]
    # the second request extends the first request and its output: the model's tokens, not re-tokenised
    first, second = engine.requests
    assert second.input_ids[: len(first.input_ids) + engine.responses[0].output_len] == [
        *first.input_ids,
        *engine.responses[0].output_ids,
    ]
    assert traj.input_ids[: len(second.input_ids)] == second.input_ids
    assert traj.reward == 1.0 and traj.metadata["completion"].strip() == "Answer: 5"


@pytest.mark.parametrize(
    ("agent", "expected"), [("returns_half", 0.5), ("sets_its_own_reward", 0.25), ("tool_agent", 0.0)]
)
def test_the_reward_precedence(agent: str, expected: float) -> None:
    engine = FakeEngine(tokenizer_by_name("tiny"), [Reply("Answer: 4")])
    traj = run(agent_workflow(agent), engine)
    assert traj is not None and traj.reward == expected


def test_an_agent_past_its_timeout_fails_the_episode() -> None:
    with pytest.raises(AgentError, match="timeout_s=0.2"):
        run(agent_workflow("sleeps", timeout_s=0.2), FakeEngine(tokenizer_by_name("tiny"), [Reply("x")]))


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        (f"{AGENTS}:sync_agent", "not an async function"),
        (f"{AGENTS}:missing", "no callable 'missing'"),
        ("no_such_module_xyz:run", "cannot import"),
        ("run", "package.module:function"),
    ],
)
def test_a_bad_agent_is_a_config_error_naming_it(agent: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AgentWorkflow(tokenizer_by_name("fake"), SAMPLING, arith_reward, agent=agent)


def test_an_agent_from_a_file_path(tmp_path: Path) -> None:
    file = tmp_path / "my_agent.py"
    file.write_text(
        textwrap.dedent(
            """
            async def run(client, data):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data.prompt}])
                return 0.75
            """
        )
    )
    workflow = AgentWorkflow(tokenizer_by_name("fake"), SAMPLING, arith_reward, agent=f"{file}:run")
    traj = run(workflow, FakeEngine(tokenizer_by_name("fake"), [Reply("hi")]))
    assert traj is not None and traj.reward == 0.75


# ---------------------------------------------------------------------------- agent_command


#: each program runs as a fresh process ("exec") and forked from a fork server that preloaded openai
MODES = pytest.mark.parametrize("mode", ["exec", "fork"])


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return tmp_path


def command_workflow(
    script: str | None, mode: str = "exec", where: Path | None = None, **options
) -> AgentCommandWorkflow:
    """The workflow running ``script`` (a file under ``where``; None: the default program)."""
    if script is not None:
        assert where is not None
        path = where / "agent_program.py"
        path.write_text(textwrap.dedent(script))
        options["command"] = [sys.executable, str(path)]
    if mode == "fork":
        options["preload"] = ["openai"]
    return AgentCommandWorkflow(tokenizer_by_name("tiny"), SAMPLING, arith_reward, **options)


def run_closed(workflow: AgentCommandWorkflow, engine: FakeEngine):
    """One episode, then the workflow's per-loop resources closed (as the executor does)."""

    async def episode():
        try:
            return await workflow.arun_episode(engine, RECORD)
        finally:
            await workflow.aclose()

    return asyncio.run(episode())


@MODES
def test_the_default_program_answers_through_the_official_sdk(mode: str) -> None:
    engine = FakeEngine(tokenizer_by_name("tiny"), [Reply("Answer: 5")])
    traj = run_closed(command_workflow(None, mode), engine)
    assert traj is not None and traj.validate() is traj
    assert traj.reward == 1.0 and len(engine.requests) == 1
    assert generated(traj.input_ids, traj.loss_mask) == engine.responses[0].output_ids
    assert json.loads(traj.metadata["agent_stdout"]) == {"answer": "Answer: 5"}


SETS_REWARD = """
    import json, os, sys, httpx
    from openai import OpenAI
    task = json.load(sys.stdin)
    with OpenAI(max_retries=0) as client:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}])
    base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    httpx.post(base + "/rl/set_reward", json={"reward": 0.125}, headers=headers).raise_for_status()
"""


@MODES
def test_a_program_sets_its_own_reward_through_the_proxy(mode: str, tmp_path: Path) -> None:
    traj = run_closed(
        command_workflow(SETS_REWARD, mode, tmp_path), FakeEngine(tokenizer_by_name("tiny"), [Reply("Answer: 5")])
    )
    assert traj is not None and traj.reward == 0.125


@MODES
def test_a_failing_program_fails_the_episode_with_its_stderr(mode: str, tmp_path: Path) -> None:
    script = "import sys; print('tool exploded', file=sys.stderr); sys.exit(3)"
    with pytest.raises(AgentError, match="exited with 3: tool exploded"):
        run_closed(command_workflow(script, mode, tmp_path), FakeEngine(tokenizer_by_name("tiny"), [Reply("x")]))


@MODES
def test_a_program_past_its_timeout_is_killed_with_its_children(mode: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """
    with pytest.raises(AgentError, match="timeout_s=2"):
        run_closed(
            command_workflow(script, mode, tmp_path, timeout_s=2), FakeEngine(tokenizer_by_name("tiny"), [Reply("x")])
        )
    child = int(pid_file.read_text())
    for _ in range(50):  # the kill is sent; the child is reaped by init shortly after
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        asyncio.run(asyncio.sleep(0.1))
    else:
        pytest.fail(f"the program's child {child} outlived the timeout")


@MODES
def test_the_program_sees_neither_secrets_nor_the_answer(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    script = """
        import json, os, sys
        from openai import OpenAI
        task = json.load(sys.stdin)
        with OpenAI(max_retries=0) as client:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}])
        print(json.dumps({"task": task, "env": sorted(os.environ)}))
    """
    traj = run_closed(
        command_workflow(script, mode, tmp_path, env={"EXTRA": "1"}),
        FakeEngine(tokenizer_by_name("tiny"), [Reply("x")]),
    )
    seen = json.loads(traj.metadata["agent_stdout"])
    assert "AWS_SECRET_ACCESS_KEY" not in seen["env"] and "EXTRA" in seen["env"]
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY"} <= set(seen["env"])
    assert "answer" not in seen["task"] and seen["task"]["prompt"] == RECORD.prompt


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"command": []}, "command"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"env": {"OPENAI_API_KEY": "x"}}, "must not set OPENAI_BASE_URL or OPENAI_API_KEY"),
        ({"preload": ["openai"], "command": ["prog", "--flag"]}, "preload needs command"),
        ({"preload": ["no module"]}, "must be module names"),
    ],
)
def test_bad_command_options_are_config_errors(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AgentCommandWorkflow(tokenizer_by_name("fake"), SAMPLING, arith_reward, **options)


def test_a_preload_that_cannot_import_is_an_agent_error_naming_it(tmp_path: Path) -> None:
    workflow = command_workflow("print('never runs')", "exec", tmp_path, preload=["no_such_module_xyz"])
    with pytest.raises(AgentError, match=r"could not import preload=\['no_such_module_xyz'\]"):
        run_closed(workflow, FakeEngine(tokenizer_by_name("tiny"), [Reply("x")]))


def test_a_forked_program_runs_as_python_would_and_each_episode_is_fresh(tmp_path: Path) -> None:
    """__main__, argv, sys.path[0] (the script's directory, not the fork server's: its siblings such
    as requests.py must not shadow the agent's imports), and module state not shared across runs."""
    (tmp_path / "helper_mod.py").write_text("COUNT = []\n")
    script = """
        import json, sys
        import helper_mod
        helper_mod.COUNT.append(1)
        print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "count": len(helper_mod.COUNT),
                          "shadowed": "areal_tasks/agent" in sys.path[0]}))
        from openai import OpenAI
        task = json.load(sys.stdin)
        with OpenAI(max_retries=0) as client:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}])
    """
    workflow = command_workflow(script, "fork", tmp_path)
    engine = FakeEngine(tokenizer_by_name("tiny"), [Reply("Answer: 5"), Reply("Answer: 5")])

    async def two_episodes():
        try:
            return [await workflow.arun_episode(engine, RECORD) for _ in range(2)]
        finally:
            await workflow.aclose()

    for traj in asyncio.run(two_episodes()):
        seen = json.loads(traj.metadata["agent_stdout"].splitlines()[0])
        assert seen == {
            "name": "__main__",
            "argv": [str(tmp_path / "agent_program.py")],
            "path0": str(tmp_path),
            "count": 1,
            "shadowed": False,
        }


def test_concurrent_first_episodes_share_one_proxy_and_fork_server(tmp_path: Path) -> None:
    script = """
        import json, sys
        from openai import OpenAI
        task = json.load(sys.stdin)
        with OpenAI(max_retries=0) as client:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}])
    """
    workflow = command_workflow(script, "fork", tmp_path)
    engine = FakeEngine(tokenizer_by_name("tiny"), [Reply("Answer: 5")] * 6)

    async def six_at_once():
        try:
            trajs = await asyncio.gather(*(workflow.arun_episode(engine, RECORD) for _ in range(6)))
            (loop_entry,) = workflow._per_loop.values()
            _proxy, runner = loop_entry[1].result()
            return trajs, runner._server.pid
        finally:
            await workflow.aclose()

    trajs, server_pid = asyncio.run(six_at_once())
    assert all(t is not None and t.reward == 1.0 for t in trajs)
    assert not workflow._per_loop
    assert not Path(f"/proc/{server_pid}").exists() or "Z" in Path(f"/proc/{server_pid}/stat").read_text().split()[2]


def test_the_guide_trains_an_existing_sdk_agent_by_its_base_url_only(tmp_path: Path, monkeypatch) -> None:
    """docs/agents.md's agent and config, as written: the agent answers through the proxy session."""
    from areal_tasks.config import load_config
    from areal_tasks.rollout.workflows import build_workflow

    root = HERE.parents[3]
    guide = (root / "docs" / "agents.md").read_text(encoding="utf-8")
    section = guide.split("## Train an existing agent by changing only its base URL", 1)[1]
    agent = section.split("```python\n", 1)[1].split("```", 1)[0]
    config = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_agent.py").write_text(agent)
    (tmp_path / "my_agent.yaml").write_text(
        config.replace("configs/demo_grpo.yaml", str(root / "configs/demo_grpo.yaml"))
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config("my_agent.yaml", [])
    workflow = build_workflow(
        cfg.rollout.workflow, tokenizer_by_name("tiny"), SAMPLING, arith_reward, max_prompt_len=None
    )
    traj = run_closed(workflow, FakeEngine(tokenizer_by_name("tiny"), [Reply("Answer: 5")]))
    assert traj is not None and traj.reward == 1.0
    assert traj.metadata["agent_stdout"].strip() == "Answer: 5"
