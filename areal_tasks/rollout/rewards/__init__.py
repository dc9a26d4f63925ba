"""Reward functions: the ``fn(completion, answer, **kwargs) -> float`` contract, a registry of
built-ins (``exact_match``, ``numeric``, ``arithmetic``, ``math_verify``, the math-benchmark
``gsm8k`` and ``math``, the sandboxed ``code_tests``), import-path specs
(``package.module:function``) and :class:`RewardRunner`, which scores with a timeout in killable
worker processes. Torch-free; see ``docs/rewards.md``.
"""

from areal_tasks.errors import RewardError, RewardTimeoutError
from areal_tasks.rollout.rewards.builtin import arithmetic, exact_match, math_verify, numeric
from areal_tasks.rollout.rewards.math_rewards import gsm8k, math_boxed
from areal_tasks.rollout.rewards.registry import (
    RewardFn,
    register_reward,
    registered_name,
    resolve_reward,
    reward_names,
)
from areal_tasks.rollout.rewards.runner import RewardRunner
from areal_tasks.rollout.rewards.sandbox import code_tests, score_code

__all__ = [
    "RewardError",
    "RewardFn",
    "RewardRunner",
    "RewardTimeoutError",
    "arithmetic",
    "code_tests",
    "exact_match",
    "gsm8k",
    "math_boxed",
    "math_verify",
    "numeric",
    "register_reward",
    "registered_name",
    "resolve_reward",
    "reward_names",
    "score_code",
]
