"""The inference-backend registry is the one list of inference backends: the config grammar, the
allocation grammar, validation, the client and the launcher all read it."""

from __future__ import annotations

import typing

import pytest

from areal_tasks.config import load_config
from areal_tasks.config.allocation.backends import ALLOWED_DIMS, INFERENCE_BACKENDS, kind_of
from areal_tasks.config.rollout import RolloutConfig
from areal_tasks.config.validate import gpu_only_backends
from areal_tasks.errors import ConfigError
from areal_tasks.inference.client.protocol import ProtocolAdapter
from areal_tasks.inference.launch import build_server_command
from areal_tasks.inference.registry import (
    gpu_only_inference_backends,
    inference_backend,
    inference_backend_names,
    make_adapter,
    server_command_builder,
)


def test_rollout_backend_literal_equals_the_registry() -> None:
    hint = typing.get_type_hints(RolloutConfig)["backend"]
    assert set(typing.get_args(hint)) == set(inference_backend_names())


def test_the_allocation_grammar_derives_its_inference_side_from_the_registry() -> None:
    assert INFERENCE_BACKENDS == inference_backend_names() == ("embedded", "sglang", "vllm")
    for name in inference_backend_names():
        assert kind_of(name) == "inference"
        assert ALLOWED_DIMS[name] == inference_backend(name).dims


@pytest.mark.parametrize("name", inference_backend_names())
def test_every_backend_has_an_adapter_and_a_launcher(name: str) -> None:
    adapter = make_adapter(name)
    assert isinstance(adapter, ProtocolAdapter) and adapter.name == name
    assert callable(server_command_builder(name))
    cfg = load_config(None, [f"rollout.backend={name}", f"allocation={name}:d1+fsdp:d1", "cluster.gpus_per_node=2"])
    assert build_server_command(cfg, "/models/m").backend == name


def test_gpu_only_backends_come_from_the_registry() -> None:
    assert gpu_only_inference_backends() == {"sglang"}
    assert gpu_only_inference_backends() <= gpu_only_backends()


def test_unknown_backends_name_the_closest_and_the_list() -> None:
    with pytest.raises(ConfigError, match=r"unknown inference backend 'vlm'; did you mean 'vllm'\?"):
        inference_backend("vlm")
    with pytest.raises(ConfigError, match=r"known: embedded, sglang, vllm"):
        server_command_builder("tgi")
