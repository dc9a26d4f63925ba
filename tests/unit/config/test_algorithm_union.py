"""The ``algorithm`` section is a tagged union: ``name`` picks the dataclass that checks the other keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from areal_tasks.config import load_config
from areal_tasks.config.algorithm import AlgorithmConfig, DAPOConfig, GRPOConfig, PPOConfig
from areal_tasks.config.build import build_dataclass
from areal_tasks.errors import ConfigError


def test_default_is_grpo() -> None:
    assert type(load_config().algorithm) is GRPOConfig


def test_name_override_then_a_knob_of_that_algorithm() -> None:
    cfg = load_config(None, ["algorithm.name=dapo", "algorithm.overlong_buffer_len=16"])
    assert type(cfg.algorithm) is DAPOConfig
    assert cfg.algorithm.overlong_buffer_len == 16


def test_knob_before_name_also_works() -> None:
    cfg = load_config(None, ["algorithm.overlong_buffer_len=16", "algorithm.name=dapo"])
    assert type(cfg.algorithm) is DAPOConfig and cfg.algorithm.overlong_buffer_len == 16


def test_knob_of_another_algorithm_is_unknown() -> None:
    with pytest.raises(ConfigError, match="algorithm.overlong_buffer_len: unknown key") as info:
        load_config(None, ["algorithm.overlong_buffer_len=16"])  # grpo has no overlong shaping
    assert "Valid keys at algorithm: name, eps_clip" in str(info.value)


def test_knob_type_is_checked_against_the_chosen_algorithm() -> None:
    with pytest.raises(ConfigError, match="algorithm.gamma: expected float, got 'high'"):
        load_config(None, ["algorithm.name=ppo", "critic.value_head=true", "algorithm.gamma=high"])


def test_switching_algorithm_by_override_drops_the_file_knobs(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("algorithm: {name: dapo, overlong_buffer_len: 8}\n", encoding="utf-8")
    cfg = load_config(path, ["algorithm.name=gspo"])
    assert cfg.algorithm.name == "gspo" and not hasattr(cfg.algorithm, "overlong_buffer_len")


def test_unknown_algorithm_name_suggests() -> None:
    with pytest.raises(ConfigError, match="algorithm.name: unknown algorithm 'grpoo'. Did you mean 'grpo'"):
        load_config(None, ["algorithm.name=grpoo"])


def test_algorithm_own_validation_is_reported_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algorithm.eps_clip=2"])
    assert "algorithm.eps_clip: got 2.0" in str(info.value)
    assert "algorithm: algorithm." not in str(info.value)


def test_needs_critic_selects_ppo_with_critic() -> None:
    cfg = load_config(None, ["algorithm.name=ppo", "critic.value_head=true"])
    assert type(cfg.algorithm) is PPOConfig and cfg.critic is not None and cfg.critic.value_head


# ---- the union is generic: any dataclass with a variant_class classmethod --------------------


@dataclass
class _Shape:
    name: str = "circle"

    @classmethod
    def variant_class(cls, name: str) -> type[_Shape]:
        variants: dict[str, type[_Shape]] = {"circle": _Circle, "square": _Square}
        if name not in variants:
            raise ConfigError(f"unknown shape {name!r}")
        return variants[name]


@dataclass
class _Circle(_Shape):
    name: str = "circle"
    radius: float = 1.0


@dataclass
class _Square(_Shape):
    name: str = "square"
    side: int = 2
    kind: ClassVar[str] = "polygon"


@dataclass
class _Holder:
    shape: _Shape = field(default_factory=_Circle)


def test_any_dataclass_with_variant_class_is_a_tagged_union() -> None:
    assert build_dataclass(_Holder, {"shape": {"name": "square", "side": 3}}).shape == _Square(side=3)
    assert build_dataclass(_Holder, {"shape": {"radius": 2}}).shape == _Circle(radius=2.0)
    with pytest.raises(ConfigError, match="shape.name: unknown shape 'hexagon'"):
        build_dataclass(_Holder, {"shape": {"name": "hexagon"}})
    assert issubclass(_Square, AlgorithmConfig) is False
