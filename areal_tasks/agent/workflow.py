"""The ``agent`` workflow: user agent code ``async def run(client, data) -> reward`` as a rollout episode.

The agent gets an :class:`~areal_tasks.agent.client.ArealOpenAI` (used like ``openai.AsyncOpenAI``)
bound to the episode's engine and a fresh interaction cache, and the dataset item. Whatever it does
with the client (any number of turns, tool calls, forks) is recorded; the episode's sample is the
conversation that ends in the agent's **last** completion, exported as one concatenated trajectory
(only model-generated tokens trained). The reward, in order of precedence:

1. the agent's return value (a number), set on the last completion;
2. rewards the agent set itself (``client.cache.set_reward`` / ``set_last_reward``);
3. the job's reward function on the last completion's text and the item's answer.

An agent that made no call, or whose last completion generated nothing, rejects the episode
(``None``). An agent taking a ``system_prompt`` keyword gets ``rollout.workflow.system_prompt``. The
default agent (:func:`~areal_tasks.agent.builtin.chat_once`) asks once with the job's system prompt:
the ``rlvr`` workflow, through the client.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from areal_tasks.agent.episode import episode_trajectory, resolve_callable
from areal_tasks.api.inference import InferenceEngine, SamplingParams
from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.datasets.prompts import SYSTEM_PROMPT
from areal_tasks.errors import AgentError, ConfigError
from areal_tasks.rollout.workflows.rlvr import RewardFn, check_positive

logger = logging.getLogger(__name__)

__all__ = ["AgentOptions", "AgentWorkflow"]

DEFAULT_AGENT = "areal_tasks.agent.builtin:chat_once"


@dataclass(frozen=True)
class AgentOptions:
    """The options of ``agent`` (``rollout.workflow.options``), checked when built."""

    #: the agent ``async def run(client, data) -> float | None``: ``package.module:function`` or
    #: ``path/to/file.py:function`` (relative to the working directory).
    agent: str = DEFAULT_AGENT
    #: seconds an episode's agent may run; past it the episode fails (and counts as failed).
    timeout_s: float = 600.0
    #: tool-call format of the model's output (``hermes``: ``<tool_call>{...}</tool_call>`` blocks).
    tool_call_parser: str = "hermes"

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.agent, str) or ":" not in self.agent:
            problems.append(f"agent={self.agent!r} must be package.module:function or path/to/file.py:function")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            problems.append(f"timeout_s={timeout!r} must be a number > 0")
        if problems:
            raise ConfigError("; ".join(problems))


class AgentWorkflow(RolloutWorkflow):
    """One call of the agent per episode; its last conversation is the sample (see the module doc)."""

    options_class: ClassVar[type] = AgentOptions

    def __init__(
        self,
        tokenizer: Any,
        sampling: SamplingParams,
        reward: RewardFn,
        *,
        agent: str = AgentOptions.agent,
        timeout_s: float = AgentOptions.timeout_s,
        tool_call_parser: str = AgentOptions.tool_call_parser,
        system_prompt: str | None = SYSTEM_PROMPT,
        max_prompt_len: int | None = None,
    ) -> None:
        options = AgentOptions(agent, timeout_s, tool_call_parser)
        check_positive("max_prompt_len", max_prompt_len)
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.reward = reward
        self.timeout_s = float(options.timeout_s)
        self.tool_call_parser = options.tool_call_parser
        self.system_prompt = system_prompt
        self.max_prompt_len = max_prompt_len
        self.agent_path = options.agent
        self.agent = resolve_callable(options.agent, "rollout.workflow.options.agent")
        if not inspect.iscoroutinefunction(self.agent):
            raise ConfigError(f"rollout.workflow.options.agent: {options.agent!r} is not an async function")
        self._agent_kwargs: dict[str, Any] = {}
        if "system_prompt" in inspect.signature(self.agent).parameters:
            self._agent_kwargs["system_prompt"] = system_prompt

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        """Run the agent on ``data``; its last conversation, rewarded, or None (see the module doc)."""
        from areal_tasks.agent.client import ArealOpenAI

        client = ArealOpenAI(engine, self.tokenizer, sampling=self.sampling, tool_call_parser=self.tool_call_parser)
        try:
            returned = await asyncio.wait_for(self.agent(client, data, **self._agent_kwargs), self.timeout_s)
        except TimeoutError as exc:
            raise AgentError(f"agent {self.agent_path} ran past timeout_s={self.timeout_s:g}") from exc
        if returned is not None and (isinstance(returned, bool) or not isinstance(returned, (int, float))):
            raise AgentError(f"agent {self.agent_path} returned {returned!r}; expected a number or None")
        traj = await episode_trajectory(
            client.cache,
            data,
            self.reward,
            self.tokenizer,
            returned=None if returned is None else float(returned),
            max_prompt_len=self.max_prompt_len,
        )
        if traj is not None:
            traj.metadata["agent"] = self.agent_path
        return traj
