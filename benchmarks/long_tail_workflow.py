"""A benchmark workflow with a long-tail generation cost: RLVR plus a discarded "filler" generation.

The demo task's answers are a few tokens long, so every episode costs about the same; real RL
rollouts have long-tailed response lengths, and that tail is what asynchronous RL hides. Each
episode here first runs the ordinary RLVR episode (its trajectory is what gets trained, unchanged),
then generates a filler continuation of ``L`` tokens from the same prompt with ``ignore_eos`` and
throws it away, with ``L`` drawn from a Pareto distribution (``AREAL_BENCH_TAIL_ALPHA``, default
1.2; at least ``AREAL_BENCH_TAIL_MIN`` tokens, default 4; capped at ``AREAL_BENCH_TAIL_MAX``,
default 256) seeded per episode. The inference server really decodes those tokens, so the episode
takes as long as a response of that length would; learning is the same as with plain RLVR.

Used by ``benchmarks/async_vs_sync.py`` as ``rollout.workflow.name=benchmarks.long_tail_workflow:LongTailWorkflow``.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import replace
from typing import Any

from areal_tasks.api.inference import InferenceEngine, ModelRequest
from areal_tasks.api.workflow import Trajectory
from areal_tasks.rollout.workflows import RLVRWorkflow, item_fields

_counter = itertools.count()


def filler_length(rng: random.Random, alpha: float, low: int, high: int) -> int:
    """A Pareto(alpha) length scaled to start at ``low``, capped at ``high``."""
    return min(high, int(low * rng.paretovariate(alpha)))


class LongTailWorkflow(RLVRWorkflow):
    """RLVR whose episodes also decode a discarded, long-tailed number of tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alpha = float(os.environ.get("AREAL_BENCH_TAIL_ALPHA", "1.2"))
        self.low = int(os.environ.get("AREAL_BENCH_TAIL_MIN", "4"))
        self.high = int(os.environ.get("AREAL_BENCH_TAIL_MAX", "256"))
        self.seed = int(os.environ.get("AREAL_BENCH_SEED", "0"))
        self.filler_tokens = 0

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        trajectory = await super().arun_episode(engine, data)
        if trajectory is None:
            return None
        rng = random.Random(self.seed * 1_000_003 + next(_counter))
        length = filler_length(rng, self.alpha, self.low, self.high)
        prompt, _ = item_fields(data)
        sampling = replace(self.sampling, max_new_tokens=length, ignore_eos=True, stop=(), stop_token_ids=())
        await engine.agenerate(ModelRequest(self.render(prompt), sampling))
        self.filler_tokens += length
        trajectory.metadata["filler_tokens"] = length
        return trajectory
