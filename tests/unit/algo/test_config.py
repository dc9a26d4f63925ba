"""Algorithm config dataclasses: defaults validate, bad values raise ConfigError naming the field,
and the module stays torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from areal_tasks.config.algorithm import (
    AlgorithmConfig,
    DAPOConfig,
    DrGRPOConfig,
    GRPOConfig,
    PPOConfig,
    ReinforcePlusPlusConfig,
)
from areal_tasks.errors import ConfigError


@pytest.mark.parametrize("name", AlgorithmConfig.names())
def test_every_default_config_is_valid_and_named(name: str) -> None:
    config = AlgorithmConfig.variant_class(name)()
    assert config.name == name


@pytest.mark.parametrize(
    ("cls", "field", "value"),
    [
        (GRPOConfig, "eps_clip", 0.0),
        (GRPOConfig, "eps_clip_high", -0.1),
        (GRPOConfig, "dual_clip", 1.0),
        (GRPOConfig, "loss_agg_mode", "sum"),
        (GRPOConfig, "kl_coef", -1.0),
        (GRPOConfig, "kl_estimator", "k4"),
        (GRPOConfig, "kl_in_reward", "yes"),
        (GRPOConfig, "reward_scale", 0.0),
        (GRPOConfig, "prox_approx", "linear"),
        (GRPOConfig, "behav_imp_weight_cap", 0.5),
        (GRPOConfig, "behav_imp_weight_mode", "clip"),
        (GRPOConfig, "behav_imp_weight_level", "batch"),
        (GRPOConfig, "adv_norm_std", "global"),
        (GRPOConfig, "norm_eps", 0.0),
        (GRPOConfig, "entropy_coef", "0.1"),
        (DrGRPOConfig, "loss_agg_constant", None),
        (PPOConfig, "gamma", 1.5),
        (PPOConfig, "gae_lambda", -0.1),
        (PPOConfig, "value_loss", "l1"),
        (PPOConfig, "value_clip", 0.0),
        (DAPOConfig, "overlong_buffer_len", 30000),
        (DAPOConfig, "overlong_max_len", 0),
        (ReinforcePlusPlusConfig, "baseline", "critic"),
    ],
)
def test_bad_value_names_the_field(cls: type, field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"algorithm\.{field}: got {value!r}"):
        cls(**{field: value})


def test_mask_mode_needs_a_cap() -> None:
    with pytest.raises(ConfigError, match="behav_imp_weight_cap"):
        GRPOConfig(behav_imp_weight_mode="mask", behav_imp_weight_cap=None)


def test_name_must_match_the_config_class() -> None:
    with pytest.raises(ConfigError, match="algorithm.name: got 'ppo'"):
        GRPOConfig(name="ppo")


def test_unknown_name_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'dapo'"):
        AlgorithmConfig.variant_class("dappo")


def test_config_module_is_torch_free() -> None:
    code = "import sys, areal_tasks.config.algorithm; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
