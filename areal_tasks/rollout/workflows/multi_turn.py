"""Multi-turn RLVR: retry after a wrong answer, with a discounted reward.

:class:`MultiTurnWorkflow` generates a first answer as :class:`~.rlvr.RLVRWorkflow` does. While the
turn's reward is below 1 and turns remain, it appends a user turn saying ``feedback`` (template
tokens from :func:`~.tokens.feedback_segment`, never trained) and generates again from the whole
sequence so far. The episode's reward is the last turn's reward times
``turn_discount ** (turns_used - 1)``, so an answer right at the first try is worth the most.
``max_total_tokens`` bounds the sequence: a turn that could overrun it is not started. The options
(``rollout.workflow.options``) are :class:`MultiTurnOptions`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from areal_tasks.api.inference import InferenceEngine, ModelRequest, SamplingParams
from areal_tasks.api.workflow import Trajectory
from areal_tasks.datasets.prompts import SYSTEM_PROMPT
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.workflows.rlvr import (
    RewardFn,
    RLVRWorkflow,
    check_positive,
    item_fields,
    response_metadata,
    reward_extras,
)
from areal_tasks.rollout.workflows.tokens import FeedbackSegment, TrajectoryBuilder, feedback_segment
from areal_tasks.trace.sessions import note_rejection

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_FEEDBACK", "MultiTurnOptions", "MultiTurnWorkflow"]

DEFAULT_FEEDBACK = "Your answer is wrong. Try again."


@dataclass(frozen=True)
class MultiTurnOptions:
    """The options of ``multi_turn`` (``rollout.workflow.options``), checked when built."""

    #: most assistant turns per episode.
    max_turns: int = 2
    #: the reward of turn k is multiplied by ``turn_discount ** (k - 1)``; in (0, 1].
    turn_discount: float = 0.9
    #: the user message after a wrong answer.
    feedback: str = DEFAULT_FEEDBACK
    #: most tokens of a whole episode (prompt, turns, feedback); a turn that could overrun it is not
    #: started. None = no bound.
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_turns", "max_total_tokens"):
            try:
                check_positive(name, getattr(self, name))
            except ConfigError as exc:
                problems.append(str(exc))
        discount = self.turn_discount
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0 < discount <= 1:
            problems.append(f"turn_discount={discount!r} must be in (0, 1]")
        if not isinstance(self.feedback, str) or not self.feedback.strip():
            problems.append("feedback must be a non-empty message")
        if problems:
            raise ConfigError("; ".join(problems))


class MultiTurnWorkflow(RLVRWorkflow):
    """Up to ``max_turns`` answers to one prompt, with a feedback turn after each wrong one."""

    options_class: ClassVar[type] = MultiTurnOptions

    def __init__(
        self,
        tokenizer: Any,
        sampling: SamplingParams,
        reward: RewardFn,
        *,
        max_turns: int = MultiTurnOptions.max_turns,
        turn_discount: float = MultiTurnOptions.turn_discount,
        feedback: str = MultiTurnOptions.feedback,
        system_prompt: str | None = SYSTEM_PROMPT,
        max_prompt_len: int | None = None,
        max_total_tokens: int | None = MultiTurnOptions.max_total_tokens,
    ) -> None:
        super().__init__(tokenizer, sampling, reward, system_prompt=system_prompt, max_prompt_len=max_prompt_len)
        options = MultiTurnOptions(max_turns, turn_discount, feedback, max_total_tokens)
        self.max_turns = options.max_turns
        self.turn_discount = float(options.turn_discount)
        self.feedback = options.feedback
        self.max_total_tokens = options.max_total_tokens
        #: the feedback turn's template tokens (derived once, so a template unfit for multi-turn
        #: episodes fails here rather than in every episode).
        self.segment: FeedbackSegment = feedback_segment(tokenizer, feedback, system_prompt)

    def _turn_fits(self, length: int) -> bool:
        """Whether a turn from a sequence of ``length`` tokens stays within ``max_total_tokens``."""
        return self.max_total_tokens is None or length + self.sampling.max_new_tokens <= self.max_total_tokens

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        """Answer, get feedback, answer again...; ``None`` for a too-long prompt or an empty first answer."""
        _, answer = item_fields(data)
        extras = reward_extras(data)
        prompt_ids = self.render_item(data)
        if not self.prompt_fits(prompt_ids):
            return None
        if not self._turn_fits(len(prompt_ids)):
            logger.debug(
                "rejecting a prompt of %d tokens: no room for a turn (max_total_tokens=%d)",
                len(prompt_ids),
                self.max_total_tokens,
            )
            note_rejection("no room for a turn (max_total_tokens)")
            return None
        builder = TrajectoryBuilder(prompt_ids)
        turns: list[dict[str, Any]] = []
        ended_by = "max_turns"
        last_output: list[int] = []
        for turn in range(1, self.max_turns + 1):
            if turn > 1:
                context = self.segment.after(last_output)
                if not self._turn_fits(len(builder) + len(context)):
                    ended_by = "max_total_tokens"
                    break
                builder.add_context(context)
            response = await engine.agenerate(ModelRequest(list(builder.input_ids), self.sampling))
            if turn == 1 and not response.output_ids:
                logger.debug("rejecting an empty first answer (stop_reason=%s)", response.stop_reason)
                note_rejection("empty output")
                return None
            builder.add_generated(response)
            last_output = list(response.output_ids)
            completion = self.decode(last_output)
            reward = float(await self.reward(completion, answer, **extras))
            turns.append({**response_metadata(response, completion), "reward": reward})
            if reward >= 1.0:
                ended_by = "correct"
                break
        return builder.build(self._episode_reward(turns), self._metadata(turns, answer, ended_by))

    def _episode_reward(self, turns: list[dict[str, Any]]) -> float:
        return turns[-1]["reward"] * self.turn_discount ** (len(turns) - 1)

    @staticmethod
    def _metadata(turns: list[dict[str, Any]], answer: str, ended_by: str) -> dict[str, Any]:
        last = turns[-1]
        return {
            "stop_reason": last["stop_reason"],
            "completion": last["completion"],
            "answer": answer,
            "n_output_tokens": sum(t["n_output_tokens"] for t in turns),
            "latency_s": sum(t["latency_s"] for t in turns),
            "n_resubmits": sum(t["n_resubmits"] for t in turns),
            "turns": len(turns),
            "turn_rewards": [t["reward"] for t in turns],
            "turn_stop_reasons": [t["stop_reason"] for t in turns],
            "completions": [t["completion"] for t in turns],
            "ended_by": ended_by,
        }
