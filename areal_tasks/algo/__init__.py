"""RL algorithms: advantages and losses as pure functions of tensors, and small Algorithm objects.

Use :func:`build_algorithm` with a config from ``areal_tasks.config.algorithm``::

    algo = build_algorithm(AlgorithmConfig.variant_class("grpo")())
    batch = algo.compute_advantages(batch)
    engine.train_batch(batch, loss_fn=algo.actor_loss_fn, loss_weight_fn=algo.actor_loss_weight_fn)

Pure functions live in ``layout``, ``gae``, ``normalize``, ``kl``, ``shaping``, ``ratios``,
``losses``, ``aggregate``, ``filters`` and ``actor``; algorithms in ``algorithms/``. Where each
departs from its paper is documented in its module and in docs/algorithms.md.
"""

from areal_tasks.algo import algorithms as _algorithms  # noqa: F401  (registers the algorithms)
from areal_tasks.algo.base import Algorithm, algorithm_names, build_algorithm, register_algorithm

__all__ = ["Algorithm", "algorithm_names", "build_algorithm", "register_algorithm"]
