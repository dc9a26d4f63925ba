"""The ``agent_command`` workflow: any program that speaks OpenAI, trained through a proxy session.

Each episode starts a fresh session on an in-process :class:`~areal_tasks.agent.proxy.ProxyServer`
(one per event loop, bound to 127.0.0.1, started with the first episode) and runs ``command`` with
``OPENAI_BASE_URL`` (the proxy's ``/v1``) and ``OPENAI_API_KEY`` (the session's own key) in its
environment, so an unmodified agent built on the ``openai`` SDK, the ``openai-agents`` SDK or any
OpenAI-speaking framework talks to the policy. The dataset item reaches the program as one JSON
object on stdin: its fields **without the answer**, plus ``system_prompt`` when the job has one.

When the program exits (0), the session ends; its last conversation is the sample, rewarded as in
the ``agent`` workflow: a reward the program set through the proxy (``POST /rl/set_reward`` with its
key) wins, else the job's reward function scores the last completion against the item's answer.
A non-zero exit, or running past ``timeout_s``, fails the episode (its process group is killed; a
cancelled episode kills it too). The program does not inherit the job's environment (secrets stay
out): only ``PATH``, ``HOME``, locale, temp and Python path variables, the names in
``inherit_env`` and the pairs in ``env``. ``{python}`` in ``command`` is this interpreter; a relative
path in it (``examples/agents/x.py``, ``.venv-agents/bin/python``) that is not under the program's
working directory but is in the checkout holding ``areal_tasks`` is taken from there, as config
paths are, so a job finds its agent whatever directory it runs in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from areal_tasks.agent.episode import episode_trajectory, item_payload, project_path
from areal_tasks.agent.program_runner import ProgramRunner
from areal_tasks.api.inference import InferenceEngine, SamplingParams
from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.datasets.prompts import SYSTEM_PROMPT
from areal_tasks.errors import AgentError, ConfigError
from areal_tasks.rollout.workflows.rlvr import RewardFn, check_positive

logger = logging.getLogger(__name__)

__all__ = ["AgentCommandOptions", "AgentCommandWorkflow"]

#: the default program: one chat turn through the official ``openai`` SDK.
DEFAULT_COMMAND: tuple[str, ...] = ("{python}", "-m", "areal_tasks.agent.sdk_chat_once")
#: environment variables every agent program inherits (nothing secret).
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT")
#: the tail of the program's stdout/stderr kept in the trajectory's metadata and error messages.
OUTPUT_TAIL = 2000


@dataclass(frozen=True)
class AgentCommandOptions:
    """The options of ``agent_command`` (``rollout.workflow.options``), checked when built."""

    #: the program and its arguments (no shell); ``{python}`` is this interpreter.
    command: list[str] | tuple[str, ...] = DEFAULT_COMMAND
    #: seconds one run may take; past it the process group is killed and the episode fails.
    timeout_s: float = 300.0
    #: extra environment variables for the program.
    env: dict[str, str] | None = None
    #: names of this process's environment variables the program also inherits.
    inherit_env: list[str] | tuple[str, ...] = ()
    #: the program's working directory (None: this process's).
    cwd: str | None = None
    #: tool-call format of the model's output, as in the ``agent`` workflow.
    tool_call_parser: str = "hermes"
    #: modules to import once in a fork server that each episode's program is forked from (the
    #: command must be ``python script.py ...`` or ``python -m module ...``); empty: exec each run.
    preload: list[str] | tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "inherit_env", tuple(self.inherit_env))
        object.__setattr__(self, "preload", tuple(self.preload))
        problems = []
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            problems.append(f"command={list(self.command)!r} must be a non-empty list of non-empty strings")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            problems.append(f"timeout_s={timeout!r} must be a number > 0")
        if self.env is not None and not (
            isinstance(self.env, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items())
        ):
            problems.append("env must map names to strings")
        if self.env and {"OPENAI_BASE_URL", "OPENAI_API_KEY"} & set(self.env):
            problems.append("env must not set OPENAI_BASE_URL or OPENAI_API_KEY: the workflow sets them per session")
        if not all(isinstance(n, str) and n for n in self.inherit_env):
            problems.append(f"inherit_env={list(self.inherit_env)!r} must be variable names")
        if not all(isinstance(n, str) and n.replace(".", "").replace("_", "").isalnum() for n in self.preload):
            problems.append(f"preload={list(self.preload)!r} must be module names")
        elif self.preload and not _forkable(self.command):
            problems.append(
                f"preload needs command=['python', 'script.py', ...] or ['python', '-m', 'module', ...], "
                f"not {list(self.command)!r}"
            )
        if problems:
            raise ConfigError("; ".join(problems))


def _argument(arg: str, cwd: str | None) -> str:
    """``{python}`` as this interpreter; a relative path (``dir/file``) that exists only in the checkout
    as its absolute path there (:func:`~areal_tasks.agent.episode.project_path`); anything else as is."""
    if arg == "{python}":
        return sys.executable
    if "/" in arg and not arg.startswith("-") and "=" not in arg:
        return project_path(arg, cwd)
    return arg


def _forkable(command: tuple[str, ...]) -> bool:
    """Whether ``command`` is an interpreter running a script or a module (what a fork server can run)."""
    if len(command) >= 3 and command[1] == "-m":
        return True
    return len(command) >= 2 and not command[1].startswith("-")


class AgentCommandWorkflow(RolloutWorkflow):
    """One run of ``command`` per episode, under its own proxy session (see the module doc)."""

    options_class: ClassVar[type] = AgentCommandOptions

    def __init__(
        self,
        tokenizer: Any,
        sampling: SamplingParams,
        reward: RewardFn,
        *,
        command: Sequence[str] = AgentCommandOptions.command,
        timeout_s: float = AgentCommandOptions.timeout_s,
        env: Mapping[str, str] | None = AgentCommandOptions.env,
        inherit_env: Sequence[str] = AgentCommandOptions.inherit_env,
        cwd: str | None = AgentCommandOptions.cwd,
        tool_call_parser: str = AgentCommandOptions.tool_call_parser,
        preload: Sequence[str] = AgentCommandOptions.preload,
        system_prompt: str | None = SYSTEM_PROMPT,
        max_prompt_len: int | None = None,
    ) -> None:
        options = AgentCommandOptions(
            tuple(command),
            timeout_s,
            None if env is None else dict(env),
            tuple(inherit_env),
            cwd,
            tool_call_parser,
            tuple(preload),
        )
        check_positive("max_prompt_len", max_prompt_len)
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.reward = reward
        self.options = options
        self.system_prompt = system_prompt
        self.max_prompt_len = max_prompt_len
        self.argv = [_argument(arg, options.cwd) for arg in options.command]
        #: per event loop (the executor's loop; each evaluation's own): the task that starts its proxy
        #: and program runner, stored before it runs so that concurrent first episodes share it.
        self._per_loop: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Task[tuple[Any, ProgramRunner]]]] = {}

    async def _loop_state(self) -> tuple[Any, ProgramRunner]:
        """The running loop's proxy (started by its first episode) and program runner."""
        loop = asyncio.get_running_loop()
        entry = self._per_loop.get(id(loop))
        if entry is None or entry[0] is not loop:
            entry = (loop, loop.create_task(self._start_loop_state()))
            self._per_loop[id(loop)] = entry
        try:
            return await asyncio.shield(entry[1])
        except Exception:
            if self._per_loop.get(id(loop)) is entry:  # the next episode tries again
                del self._per_loop[id(loop)]
            raise

    async def _start_loop_state(self) -> tuple[Any, ProgramRunner]:
        """A started proxy and a runner. The proxy's sessions are opened in-process only (each with
        the episode's own client), so its admin key is a random one nobody holds."""
        from areal_tasks.agent.proxy import ProxyServer

        proxy = ProxyServer(
            None,
            self.tokenizer,
            admin_api_key=secrets.token_urlsafe(32),
            sampling=self.sampling,
            tool_call_parser=self.options.tool_call_parser,
            queue_groups=False,
        )
        await proxy.start()
        return proxy, ProgramRunner(self.argv, preload=self.options.preload, base_env=self._environment())

    def _environment(self, base_url: str | None = None, api_key: str | None = None) -> dict[str, str]:
        """The program's environment (see the module doc); without a session's URL and key, the
        fork server's."""
        names = (*BASE_ENV, *self.options.inherit_env)
        env = {name: os.environ[name] for name in names if name in os.environ}
        env.update(self.options.env or {})
        if base_url is not None and api_key is not None:
            env.update({"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key})
        return env

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        """Run the program under a fresh session; its last conversation, rewarded, or None."""
        from areal_tasks.agent.client import ArealOpenAI

        proxy, runner = await self._loop_state()
        client = ArealOpenAI(
            engine, self.tokenizer, sampling=self.sampling, tool_call_parser=self.options.tool_call_parser
        )
        session_id, api_key = proxy.sessions.start_session(client)
        try:
            stdout = await self._run(
                runner, self._environment(proxy.url + "/v1", api_key), item_payload(data, self.system_prompt)
            )
        finally:
            # shielded: a cancelled episode still ends its session (and cancels its requests)
            result = await asyncio.shield(proxy.sessions.end_session(session_id))
        traj = await episode_trajectory(
            result.cache, data, self.reward, self.tokenizer, returned=None, max_prompt_len=self.max_prompt_len
        )
        if traj is not None:
            traj.metadata["agent_stdout"] = stdout[-OUTPUT_TAIL:]
        return traj

    async def _run(self, runner: ProgramRunner, env: dict[str, str], payload: dict[str, Any]) -> str:
        """Run the program with ``payload`` on stdin; its stdout. AgentError on failure or timeout."""
        body = json.dumps(payload, default=str).encode()  # a field JSON cannot hold goes as its text
        code, out, err = await runner.run(env, body, self.options.timeout_s, self.options.cwd)
        if code != 0:
            tail = err.decode(errors="replace")[-OUTPUT_TAIL:]
            raise AgentError(f"agent command {' '.join(self.argv[:2])} exited with {code}: {tail}")
        return out.decode(errors="replace")

    async def aclose(self) -> None:
        """Stop the running loop's fork server and proxy (the executor calls this before its loop ends)."""
        entry = self._per_loop.pop(id(asyncio.get_running_loop()), None)
        if entry is None:
            return
        try:
            proxy, runner = await entry[1]
        except (AgentError, OSError):  # it never started: nothing to stop (the episodes got its error)
            return
        try:
            await runner.aclose()
        finally:
            await proxy.stop()
