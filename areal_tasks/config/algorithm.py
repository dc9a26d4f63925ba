"""Algorithm configuration: one small dataclass per RL algorithm, chosen by ``algorithm.name``.

Torch-free. ``AlgorithmConfig`` is a tagged union for the config loader: the loader reads
``name`` first and builds the dataclass that :meth:`AlgorithmConfig.variant_class` returns, so
overrides such as ``algorithm.eps_clip_high=0.28`` are type-checked against the chosen algorithm.

``PolicyGradientConfig`` holds the knobs every policy-gradient algorithm here shares (the
decoupled PPO actor loss, KL to a reference model, reward shaping); each registered subclass adds
its own knobs and sets paper defaults. Every field is validated in ``__post_init__`` and a bad value
raises :class:`ConfigError` naming ``algorithm.<field>``. docs/algorithms.md documents every knob.

Departures from the papers (defaults chosen for asynchronous RLVR, all overridable): the
behaviour importance weight of decoupled PPO is on by default for every algorithm; no algorithm
uses a KL penalty by default (``kl_coef = 0``) except REINFORCE++ (``0.001``, in the reward).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from areal_tasks.errors import ConfigError

_REGISTRY: dict[str, type[AlgorithmConfig]] = {}

T = TypeVar("T", bound=type["AlgorithmConfig"])

NORM_LEVELS = ("none", "batch", "group")
LOSS_AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
PROX_APPROX = ("recompute", "loglinear", "none")
BEHAV_WEIGHT_MODES = ("truncate", "mask")
LEVELS = ("token", "sequence")
VALUE_LOSSES = ("mse", "huber")


def register_algorithm_config(name: str) -> Callable[[T], T]:
    """Class decorator: make a config dataclass selectable as ``algorithm.name: <name>``."""

    def wrap(cls: T) -> T:
        if name in _REGISTRY:
            raise ConfigError(f"algorithm config {name!r} is registered twice")
        _REGISTRY[name] = cls
        return cls

    return wrap


@dataclass
class AlgorithmConfig:
    """Fields every algorithm has. Subclasses add their own knobs with defaults."""

    name: str = "grpo"

    #: set by subclasses; whether the algorithm needs a critic engine.
    needs_critic: ClassVar[bool] = False

    @property
    def needs_groups(self) -> bool:
        """Whether advantages compare the samples of one prompt (then rollout.group_size must be >= 2)."""
        return False

    @classmethod
    def variant_class(cls, name: str) -> type[AlgorithmConfig]:
        """The registered config class for ``name``; a ConfigError names the closest valid name."""
        try:
            return _REGISTRY[name]
        except KeyError:
            known = sorted(_REGISTRY)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"algorithm.name: unknown algorithm {name!r}.{hint} Choose one of: {', '.join(known)}."
            ) from None

    @classmethod
    def names(cls) -> list[str]:
        return sorted(_REGISTRY)


# ---------------------------------------------------------------------------------------------
# validation helpers: each names the field, the value and what is allowed


def _fail(field: str, value: object, allowed: str) -> None:
    raise ConfigError(f"algorithm.{field}: got {value!r}; {allowed}")


def _choice(obj: object, field: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, field)
    if value not in allowed:
        _fail(field, value, f"choose one of: {', '.join(allowed)}")


def _number(
    obj: object,
    field: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    optional: bool = False,
) -> None:
    """``low <= value <= high`` (``low < value`` when ``low_open``); ``None`` only if optional."""
    value = getattr(obj, field)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(field, value, "expected a number" + (" or null" if optional else ""))
    lo_ok = low is None or (value > low if low_open else value >= low)
    hi_ok = high is None or value <= high
    if not (lo_ok and hi_ok):
        lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
        hi = "" if high is None else f"<= {high}"
        _fail(field, value, "must be " + " and ".join(s for s in (lo, hi) if s))


def _bool(obj: object, field: str) -> None:
    value = getattr(obj, field)
    if not isinstance(value, bool):
        _fail(field, value, "expected true or false")


# ---------------------------------------------------------------------------------------------
# shared policy-gradient knobs


@dataclass
class PolicyGradientConfig(AlgorithmConfig):
    """Knobs shared by every policy-gradient algorithm (not selectable by itself)."""

    # PPO clipped surrogate: ratio clipped to [1 - eps_clip, 1 + eps_clip_high].
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # None: symmetric (= eps_clip)
    dual_clip: float | None = None  # c > 1 bounds the loss of negative advantages at c * |A|
    # loss aggregation over tokens and sequences (see docs/algorithms.md#aggregation).
    loss_agg_mode: str = "token_mean"
    loss_agg_constant: float | None = None  # the constant of seq_mean_token_sum_norm
    entropy_coef: float = 0.0
    # reference-model KL: folded into the reward, or added to the loss.
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    kl_clamp: float | None = 10.0
    # reward shaping: clip((r + reward_bias) * reward_scale, -reward_clip, reward_clip).
    reward_bias: float = 0.0
    reward_scale: float = 1.0
    reward_clip: float | None = None
    # decoupled PPO: where the proximal policy comes from, and the behaviour importance weight.
    prox_approx: str = "recompute"
    use_behav_imp_weight: bool = True
    behav_imp_weight_cap: float | None = 5.0
    behav_imp_weight_mode: str = "truncate"
    behav_imp_weight_level: str = "token"
    # epsilon added to standard deviations in reward/advantage normalisation.
    norm_eps: float = 1e-6

    @property
    def needs_groups(self) -> bool:
        levels = (getattr(self, "adv_norm_mean", None), getattr(self, "adv_norm_std", None))
        return "group" in levels or getattr(self, "baseline", None) == "group"

    def __post_init__(self) -> None:
        if _REGISTRY.get(self.name) is not type(self):
            owner = next((n for n, c in _REGISTRY.items() if c is type(self)), None)
            allowed = f"this config class is algorithm {owner!r}" if owner else "this class is not selectable"
            _fail("name", self.name, allowed + "; build configs with AlgorithmConfig.variant_class(name)")
        _number(self, "eps_clip", low=0.0, high=1.0, low_open=True)
        _number(self, "eps_clip_high", low=0.0, low_open=True, optional=True)
        _number(self, "dual_clip", low=1.0, low_open=True, optional=True)
        _choice(self, "loss_agg_mode", LOSS_AGG_MODES)
        _number(self, "loss_agg_constant", low=0.0, low_open=True, optional=True)
        if self.loss_agg_mode == "seq_mean_token_sum_norm" and self.loss_agg_constant is None:
            _fail("loss_agg_constant", None, "required when loss_agg_mode is seq_mean_token_sum_norm")
        _number(self, "entropy_coef", low=0.0)
        _number(self, "kl_coef", low=0.0)
        _choice(self, "kl_estimator", KL_ESTIMATORS)
        _bool(self, "kl_in_reward")
        _number(self, "kl_clamp", low=0.0, low_open=True, optional=True)
        _number(self, "reward_bias")
        _number(self, "reward_scale", low=0.0, low_open=True)
        _number(self, "reward_clip", low=0.0, low_open=True, optional=True)
        _choice(self, "prox_approx", PROX_APPROX)
        _bool(self, "use_behav_imp_weight")
        _number(self, "behav_imp_weight_cap", low=1.0, optional=True)
        _choice(self, "behav_imp_weight_mode", BEHAV_WEIGHT_MODES)
        if self.behav_imp_weight_mode == "mask" and self.behav_imp_weight_cap is None:
            _fail("behav_imp_weight_cap", None, "required when behav_imp_weight_mode is mask")
        _choice(self, "behav_imp_weight_level", LEVELS)
        _number(self, "norm_eps", low=0.0, low_open=True)


# ---------------------------------------------------------------------------------------------
# one config per algorithm


@register_algorithm_config("ppo")
@dataclass
class PPOConfig(PolicyGradientConfig):
    """PPO with a learned critic and GAE (Schulman et al. 2017; 2015)."""

    name: str = "ppo"
    needs_critic: ClassVar[bool] = True

    gamma: float = 1.0
    gae_lambda: float = 0.95
    kl_in_reward: bool = True  # classic RLHF: token-level KL penalty in the reward
    kl_estimator: str = "k1"
    adv_norm_mean: str = "batch"
    adv_norm_std: str = "batch"
    value_clip: float | None = 0.2
    value_loss: str = "mse"
    huber_delta: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number(self, "gamma", low=0.0, high=1.0)
        _number(self, "gae_lambda", low=0.0, high=1.0)
        _choice(self, "adv_norm_mean", NORM_LEVELS)
        _choice(self, "adv_norm_std", NORM_LEVELS)
        _number(self, "value_clip", low=0.0, low_open=True, optional=True)
        _choice(self, "value_loss", VALUE_LOSSES)
        _number(self, "huber_delta", low=0.0, low_open=True)


@register_algorithm_config("grpo")
@dataclass
class GRPOConfig(PolicyGradientConfig):
    """Group Relative Policy Optimization (DeepSeekMath 2024): group-normalised rewards, no critic."""

    name: str = "grpo"
    adv_norm_mean: str = "group"
    adv_norm_std: str = "group"
    loss_agg_mode: str = "seq_mean_token_mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        _choice(self, "adv_norm_mean", NORM_LEVELS)
        _choice(self, "adv_norm_std", NORM_LEVELS)


@register_algorithm_config("dr_grpo")
@dataclass
class DrGRPOConfig(GRPOConfig):
    """Dr.GRPO (Liu et al. 2025): GRPO without std scaling and with a constant length normaliser."""

    name: str = "dr_grpo"
    adv_norm_std: str = "none"
    loss_agg_mode: str = "seq_mean_token_sum_norm"
    loss_agg_constant: float | None = 1024.0  # set to the generation budget (max_new_tokens)


@register_algorithm_config("dapo")
@dataclass
class DAPOConfig(GRPOConfig):
    """DAPO (Yu et al. 2025): clip-higher, dynamic sampling, overlong shaping, token-level loss."""

    name: str = "dapo"
    eps_clip_high: float | None = 0.28
    loss_agg_mode: str = "token_mean"
    dynamic_sampling: bool = True
    overlong_max_len: int | None = 20480  # None disables the overlong penalty
    overlong_buffer_len: int = 4096
    overlong_penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _bool(self, "dynamic_sampling")
        _number(self, "overlong_max_len", low=0, low_open=True, optional=True)
        _number(self, "overlong_buffer_len", low=0)
        _number(self, "overlong_penalty_factor", low=0.0)
        if self.overlong_max_len is not None and self.overlong_buffer_len >= self.overlong_max_len:
            _fail("overlong_buffer_len", self.overlong_buffer_len, "must be < algorithm.overlong_max_len")


@register_algorithm_config("rloo")
@dataclass
class RLOOConfig(PolicyGradientConfig):
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024): baseline = mean reward of the other samples."""

    name: str = "rloo"
    kl_in_reward: bool = True  # sequence-level KL subtracted from the reward, as in the paper
    kl_estimator: str = "k1"

    @property
    def needs_groups(self) -> bool:
        return True  # the leave-one-out baseline is the mean of the *other* samples of the group


@register_algorithm_config("reinforce_plus_plus")
@dataclass
class ReinforcePlusPlusConfig(PolicyGradientConfig):
    """REINFORCE++ (Hu 2025): token-level KL in the reward, globally normalised advantages."""

    name: str = "reinforce_plus_plus"
    gamma: float = 1.0
    kl_coef: float = 0.001
    kl_in_reward: bool = True
    kl_estimator: str = "k1"
    baseline: str = "none"  # "group": REINFORCE++-baseline (subtract the group mean reward first)

    def __post_init__(self) -> None:
        super().__post_init__()
        _number(self, "gamma", low=0.0, high=1.0)
        _choice(self, "baseline", ("none", "group"))


@register_algorithm_config("gspo")
@dataclass
class GSPOConfig(GRPOConfig):
    """Group Sequence Policy Optimization (Qwen 2025): length-normalised sequence-level ratio."""

    name: str = "gspo"
    eps_clip: float = 3e-4
    eps_clip_high: float | None = 4e-4
    loss_agg_mode: str = "seq_mean_token_mean"
    behav_imp_weight_level: str = "sequence"
