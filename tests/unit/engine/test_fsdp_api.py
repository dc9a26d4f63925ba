"""The engine API and WeightUpdateMeta: torch-free at import, validated at construction, JSON round-trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import ConfigError


def test_api_modules_import_without_torch():
    code = (
        "import sys, areal_tasks.api.train_engine, areal_tasks.api.weight_update, areal_tasks.engine.fsdp; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_disk_and_collective_round_trip_through_json():
    for meta in (
        WeightUpdateMeta.disk("/tmp/w", version=3),
        WeightUpdateMeta.collective(4, "127.0.0.1", 29500, 3, backend="gloo", bucket_bytes=1024),
    ):
        assert WeightUpdateMeta.from_dict(json.loads(json.dumps(meta.to_dict()))) == meta


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"type": "disk", "version": 1}, "path"),
        ({"type": "disk", "version": -1, "path": "/x"}, "version"),
        ({"type": "collective", "version": 1, "master_addr": "h", "master_port": 0, "world_size": 2}, "master_port"),
        ({"type": "collective", "version": 1, "master_addr": "h", "master_port": 1, "world_size": 1}, "world_size"),
        (
            {
                "type": "collective",
                "version": 1,
                "master_addr": "h",
                "master_port": 1,
                "world_size": 2,
                "backend": "mpi",
            },
            "backend",
        ),
        ({"type": "tcp", "version": 1}, "type"),
    ],
)
def test_invalid_meta_names_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        WeightUpdateMeta(**kwargs)


def test_unknown_keys_are_rejected():
    data = WeightUpdateMeta.disk("/w", 1).to_dict() | {"surprise": 1}
    with pytest.raises(ConfigError, match="surprise"):
        WeightUpdateMeta.from_dict(data)
