"""RLVR: one prompt, one generated answer, one verifiable reward.

:class:`RLVRWorkflow` renders the item's prompt (or its chat, for a record with ``messages``) through
the chat template, generates once, decodes the output, scores it with an async reward
``reward(completion, answer, **extras) -> float`` (``extras``: the record's ``tests=`` and
``metadata=``, when it has them; see :func:`reward_extras`) and returns the
:class:`~areal_tasks.api.workflow.Trajectory` ``prompt + output`` (only the output trained). Too-long
prompts and empty outputs are rejected (``None``; the reason noted for the session trace). The
helpers here (:data:`RewardFn`, :func:`item_fields`, :func:`reward_extras`) are shared by the other
workflows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.datasets.prompts import SYSTEM_PROMPT, render_chat, render_prompt
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.workflows.tokens import TrajectoryBuilder
from areal_tasks.trace.sessions import note_rejection

logger = logging.getLogger(__name__)

__all__ = ["RLVROptions", "RLVRWorkflow", "RewardFn", "item_fields", "reward_extras"]

#: an async reward: ``await reward(completion, answer, **extras) -> float``; raising fails the episode.
RewardFn = Callable[..., Awaitable[float]]


def item_fields(data: Any) -> tuple[str, str]:
    """``(prompt, answer)`` of a dataset item: a ``Record``, any object with ``.prompt``/``.answer``,
    or a mapping with ``"prompt"``/``"answer"`` keys. Raises :class:`RolloutError` otherwise."""
    if isinstance(data, Mapping):
        if "prompt" in data and "answer" in data:
            return str(data["prompt"]), str(data["answer"])
    elif hasattr(data, "prompt") and hasattr(data, "answer"):
        return str(data.prompt), str(data.answer)
    raise RolloutError(
        f"a workflow item needs a prompt and an answer (a Record, .prompt/.answer attributes or "
        f"'prompt'/'answer' keys); got {type(data).__name__}"
    )


def reward_extras(data: Any) -> dict[str, Any]:
    """The keyword arguments a reward gets besides ``(completion, answer)``: ``tests=`` when the item
    has tests, ``metadata=`` when it has metadata (an attribute or a key of that name)."""
    extras = {}
    for name in ("tests", "metadata"):
        value = data.get(name) if isinstance(data, Mapping) else getattr(data, name, None)
        if value is not None:
            extras[name] = dict(value) if isinstance(value, Mapping) else value
    return extras


def check_positive(name: str, value: int | None) -> None:
    """ConfigError unless ``value`` is None or an int >= 1."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{name}={value!r} must be None or an int >= 1")


def response_metadata(response: ModelResponse, completion: str) -> dict[str, Any]:
    """The per-turn facts a workflow records for metrics: stop reason, text, length, timings."""
    return {
        "stop_reason": response.stop_reason,
        "completion": completion,
        "n_output_tokens": response.output_len,
        "latency_s": response.latency_s,
        "n_resubmits": response.n_resubmits,
    }


@dataclass(frozen=True)
class RLVROptions:
    """``rlvr`` takes no options of its own: ``rollout.workflow.options`` stays empty (the system
    prompt and ``max_prompt_len`` come from the job)."""


class RLVRWorkflow(RolloutWorkflow):
    """Single-turn generation scored by a verifiable reward (one trajectory per call)."""

    #: the workflow's options (``rollout.workflow.options``): a dataclass, checked before the job starts.
    options_class: ClassVar[type] = RLVROptions

    def __init__(
        self,
        tokenizer: Any,
        sampling: SamplingParams,
        reward: RewardFn,
        *,
        system_prompt: str | None = SYSTEM_PROMPT,
        max_prompt_len: int | None = None,
    ) -> None:
        check_positive("max_prompt_len", max_prompt_len)
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.reward = reward
        self.system_prompt = system_prompt
        self.max_prompt_len = max_prompt_len

    def render(self, prompt: str) -> list[int]:
        """Prompt token ids: system + user turns and the assistant header, via the chat template."""
        return render_prompt(self.tokenizer, prompt, self.system_prompt)

    def render_item(self, data: Any) -> list[int]:
        """Prompt token ids of a dataset item: its chat (``messages``) when it has one, else its prompt."""
        messages = data.get("messages") if isinstance(data, Mapping) else getattr(data, "messages", None)
        if messages:
            return render_chat(self.tokenizer, messages, self.system_prompt)
        prompt, _ = item_fields(data)
        return self.render(prompt)

    def prompt_fits(self, prompt_ids: list[int]) -> bool:
        """False (with a debug log) when the prompt is longer than ``max_prompt_len``."""
        if self.max_prompt_len is not None and len(prompt_ids) > self.max_prompt_len:
            logger.debug("rejecting a prompt of %d tokens (max_prompt_len=%d)", len(prompt_ids), self.max_prompt_len)
            note_rejection("prompt too long")
            return False
        return True

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids, without special tokens (what the reward sees)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        """Render, generate once, score; ``None`` for a too-long prompt or an empty output."""
        _, answer = item_fields(data)
        prompt_ids = self.render_item(data)
        if not self.prompt_fits(prompt_ids):
            return None
        response = await engine.agenerate(ModelRequest(list(prompt_ids), self.sampling))
        if not response.output_ids:
            logger.debug("rejecting an empty generation (stop_reason=%s)", response.stop_reason)
            note_rejection("empty output")
            return None
        completion = self.decode(response.output_ids)
        reward = float(await self.reward(completion, answer, **reward_extras(data)))
        builder = TrajectoryBuilder(prompt_ids)
        builder.add_generated(response)
        metadata = {**response_metadata(response, completion), "answer": answer, "turns": 1}
        return builder.build(reward, metadata)
