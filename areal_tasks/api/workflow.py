"""The RolloutWorkflow interface and the Trajectory it produces (torch-free).

A workflow turns one dataset item into one trained sample: it renders the prompt, generates through
an :class:`~areal_tasks.api.inference.InferenceEngine` (one or many turns), scores the result and
returns a :class:`Trajectory`, or ``None`` to reject the sample. The rollout executor calls
``arun_episode`` ``group_size`` times per prompt (each call is one sample of the GRPO group), many
episodes concurrently on one event loop, so a workflow must not block the loop: CPU-heavy or
untrusted work (reward functions) goes through an executor or a process pool.

Token alignment follows :mod:`areal_tasks.api.batch`: ``input_ids`` is the whole sequence (prompt,
every generated turn and every feedback turn); ``loss_mask[t] = 1`` only for tokens the policy
generated; ``logprobs[t]`` is the behaviour log-probability of ``input_ids[t]`` (0 where not
generated); ``versions[t]`` the policy version that generated it (-1 where not generated).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import TrajectoryError

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine

__all__ = ["RolloutWorkflow", "Trajectory", "TrajectoryError"]


@dataclass
class Trajectory:
    """One sample: the full token sequence, what to train on, and how it was scored."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float
    #: prompt tokens at the start of ``input_ids`` (never trained).
    prompt_len: int
    #: free-form facts for metrics and debugging: stop reason, turns, answer, latency...
    metadata: dict[str, Any] = field(default_factory=dict)
    #: a vision-language sample's pixel inputs, as the model's processor returns them for this
    #: sample's images (in the order of their placeholders): ``{"pixel_values": FloatTensor[P, D],
    #: "image_grid_thw": LongTensor[N, 3]}``; None for text.
    multimodal: dict[str, Any] | None = None

    def validate(self) -> Trajectory:
        """Check the per-token lists line up; return self. Raises :class:`TrajectoryError`."""
        n = len(self.input_ids)
        lengths = {"loss_mask": len(self.loss_mask), "logprobs": len(self.logprobs), "versions": len(self.versions)}
        wrong = {k: v for k, v in lengths.items() if v != n}
        if wrong:
            raise TrajectoryError(f"trajectory has {n} input_ids but {wrong}; every per-token list needs {n}")
        if not 0 < self.prompt_len <= n:
            raise TrajectoryError(f"prompt_len={self.prompt_len} must be in [1, {n}]")
        if any(self.loss_mask[: self.prompt_len]):
            raise TrajectoryError("loss_mask is 1 on prompt tokens; only generated tokens may be trained")
        if self.loss_mask and self.loss_mask[0]:
            raise TrajectoryError("loss_mask[0] is 1; the first token has no log-probability")
        for t, (m, v) in enumerate(zip(self.loss_mask, self.versions)):
            if m and v < 0:
                raise TrajectoryError(
                    f"token {t} is trained (loss_mask=1) but has version {v}; generated tokens need >= 0"
                )
        if not isinstance(self.reward, (int, float)) or self.reward != self.reward:
            raise TrajectoryError(f"reward must be a finite number, got {self.reward!r}")
        return self

    @property
    def n_generated(self) -> int:
        """Tokens the policy generated (``sum(loss_mask)``)."""
        return sum(self.loss_mask)

    def oldest_version(self) -> int | None:
        """The oldest policy version among generated tokens; None if nothing was generated."""
        generated = [v for m, v in zip(self.loss_mask, self.versions) if m]
        return min(generated) if generated else None


class RolloutWorkflow(abc.ABC):
    """One episode per call: ``await workflow.arun_episode(engine, item) -> Trajectory | None``."""

    @abc.abstractmethod
    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        """Generate and score one sample for dataset item ``data``; ``None`` rejects it.

        Raising counts as a failed episode: the executor logs it, treats it as a rejection and fails
        the run only when failures pass ``rollout.max_failure_rate``.
        """

    async def aclose(self) -> None:  # noqa: B027 - optional hook; most workflows hold nothing
        """Release what the workflow holds on the running event loop (a server, connections).

        Called on that loop when the executor stops and after each evaluation; a workflow must be
        usable again afterwards (it starts what it needs lazily). The default holds nothing.
        """
