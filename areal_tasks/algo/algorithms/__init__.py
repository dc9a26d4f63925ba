"""The registered algorithms; importing this package registers all of them with ``base``."""

from areal_tasks.algo.algorithms.dapo import DAPO
from areal_tasks.algo.algorithms.grpo import GRPO, DrGRPO
from areal_tasks.algo.algorithms.gspo import GSPO
from areal_tasks.algo.algorithms.ppo import PPO
from areal_tasks.algo.algorithms.reinforce_pp import ReinforcePlusPlus
from areal_tasks.algo.algorithms.rloo import RLOO

__all__ = ["DAPO", "GRPO", "GSPO", "PPO", "RLOO", "DrGRPO", "ReinforcePlusPlus"]
