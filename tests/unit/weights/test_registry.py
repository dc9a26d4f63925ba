"""The weight-transport registry: the one list of ``rollout.weight_update`` modes.

Every registered name resolves to a transport class of that name; validation refuses an unknown
mode with the closest name and the known ones (the config schema's ``Literal`` documents the same
names and may not drift from the registry); listing the names, checking a config and loading the
transport classes import no torch.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from areal_tasks.config.rollout import RolloutConfig
from areal_tasks.errors import ConfigError
from areal_tasks.weights.base import WeightTransport
from areal_tasks.weights.registry import WEIGHT_TRANSPORTS, transport_class

ROOT = Path(__file__).resolve().parents[3]


def test_every_registered_name_is_a_transport_of_that_name() -> None:
    assert WEIGHT_TRANSPORTS.names() == ("collective", "disk", "shared")
    for name in WEIGHT_TRANSPORTS.names():
        cls = transport_class(name)
        assert issubclass(cls, WeightTransport) and cls.name == name


def test_the_config_schema_documents_exactly_the_registered_modes() -> None:
    hints = typing.get_type_hints(RolloutConfig)
    (field,) = [f for f in dataclasses.fields(RolloutConfig) if f.name == "weight_update"]
    assert set(typing.get_args(hints[field.name])) == set(WEIGHT_TRANSPORTS.names())


def test_an_unknown_mode_is_refused_with_the_closest_and_the_known_names() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'disk'\? \(known: collective, disk, shared\)"):
        transport_class("dsik")
    from areal_tasks.config import load_config
    from areal_tasks.config.validate import collect_problems

    cfg = load_config(None, [])
    cfg.rollout.weight_update = "tape"  # type: ignore[assignment] - past the loader, as a program could
    problems = collect_problems(cfg)
    assert any(
        p.startswith("rollout.weight_update: unknown mode 'tape'; known: collective, disk, shared") for p in problems
    )


def test_listing_checking_and_loading_the_transports_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from areal_tasks.api import weights\n"
        "from areal_tasks.weights.registry import WEIGHT_TRANSPORTS, transport_class\n"
        "from areal_tasks.config import load_config\n"
        "from areal_tasks.config.validate import collect_problems\n"
        "classes = [transport_class(n) for n in WEIGHT_TRANSPORTS.names()]\n"
        "for mode in WEIGHT_TRANSPORTS.names():\n"
        "    collect_problems(load_config(None, [f'rollout.weight_update={mode}']))\n"
        "print(','.join(sorted(k for k in ('torch', 'transformers') if k in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the weight registry or a transport imported {out.stdout.strip()}"
