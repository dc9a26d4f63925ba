"""The engine registry: which training backends are built and the dims each runs, how an allocation
component's dims become an engine layout, and how ``build_engine`` calls a backend per role."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest

from areal_tasks.config.allocation.model import ParallelDims as AllocationDims
from areal_tasks.config.engine import EngineConfig
from areal_tasks.engine import registry
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.errors import ConfigError


def test_fsdp_and_archon_are_built_with_their_dims():
    assert registry.built_backends() == ("archon", "fsdp")
    assert registry.supported_dims("fsdp") == "dtc"
    assert registry.supported_dims("archon") == "dtpce"
    assert registry.hybrid_backends() == ("archon",)
    assert registry.ENGINES.get("fsdp").__name__ == "FSDPEngine"


def test_an_unbuilt_backend_is_refused_naming_the_built_ones():
    with pytest.raises(ConfigError, match=r"unknown training backend 'megatron'.*known: archon, fsdp"):
        registry.supported_dims("megatron")
    with pytest.raises(ConfigError, match=r"did you mean 'fsdp'\?"):
        registry.build_engine("actor", EngineConfig(backend="fsdpp"), "/m", parallel=None, total_steps=1)  # type: ignore[arg-type]


def test_allocation_dims_become_the_engine_layout():
    assert registry.engine_dims("fsdp", AllocationDims(d=2, t=2, c=2)) == ParallelDims(dp=2, sp=2, tp=2)
    assert registry.engine_dims("fsdp", AllocationDims(d=1, t=2)) == ParallelDims(dp=1, sp=1, tp=2)
    assert registry.engine_dims("fsdp", AllocationDims(d=1, c=2)) == ParallelDims(dp=1, sp=2, tp=1)
    with pytest.raises(ConfigError, match=r"'fsdp' does not run p2, e2; it runs d \(data\), t \(tensor\), c "):
        registry.engine_dims("fsdp", AllocationDims(d=2, p=2, e=2))
    assert registry.engine_dims("archon", AllocationDims(d=2, p=2, e=2)) == ParallelDims(dp=2, pp=2, ep=2)
    with pytest.raises(ConfigError, match=r"ep=4 must divide dp\*sp = 2\*1"):
        registry.engine_dims("archon", AllocationDims(d=2, e=4))


def test_a_hybrid_archon_layout_folds_into_one():
    from areal_tasks.config.allocation import parse_allocation

    def folded(spec: str) -> AllocationDims:
        return registry.flat_dims(parse_allocation(spec).actor())

    assert folded("embedded:d1+archon:(attn:d4|ffn:e4)") == AllocationDims(d=4, e=4)
    assert folded("embedded:d1+archon:(attn:d2c2p2|ffn:d2e2p2)") == AllocationDims(d=2, c=2, p=2, e=2)
    with pytest.raises(ConfigError, match=r"t and p must be equal in both halves \(attn t2p1, ffn t1p1\)"):
        folded("embedded:d1+archon:(attn:d2t2|ffn:e4)")


class _Recorder:
    """Stands in for an engine class: records how the registry called it."""

    calls: ClassVar[list[tuple[EngineConfig, str, dict]]] = []

    def __init__(self, config: EngineConfig, model_path: str, **kwargs: object) -> None:
        _Recorder.calls.append((config, model_path, kwargs))


@pytest.fixture
def recorder():
    _Recorder.calls = []
    registry.register_engine("recorder", _Recorder, dims="d")
    yield _Recorder
    registry.unregister_engine("recorder")


def test_build_engine_per_role(recorder):
    cfg = EngineConfig(backend="recorder")  # type: ignore[arg-type]
    dims = ParallelDims(dp=2)
    for role in ("actor", "ref", "critic"):
        registry.build_engine(role, cfg, "/m", parallel=dims, total_steps=5, temperature=0.7, seed=3)
    (actor, ref, critic) = recorder.calls
    assert actor[2] == {"parallel": dims, "total_steps": 5, "trainable": True, "temperature": 0.7, "seed": 3}
    assert ref[2]["trainable"] is False and not ref[0].value_head
    assert critic[2]["trainable"] is True and critic[0].value_head
    assert registry.supported_dims("recorder") == "d"
    with pytest.raises(ConfigError, match="does not run t2"):
        registry.engine_dims("recorder", AllocationDims(d=1, t=2))
    with pytest.raises(ConfigError, match="engine role"):
        registry.build_engine("judge", cfg, "/m", parallel=None, total_steps=1)  # type: ignore[arg-type]


def test_registering_dims_is_checked():
    with pytest.raises(ConfigError, match="must include 'd'"):
        registry.register_engine("bad", _Recorder, dims="tx")
    assert "bad" not in registry.ENGINES


def test_the_registry_imports_no_torch():
    code = (
        "import sys, areal_tasks.engine.registry as r; r.built_backends(); r.supported_dims('fsdp'); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_grammar_knows_the_built_backends_with_the_dims_they_run() -> None:
    """The allocation grammar's training table takes the built backends and their dims from this
    registry; the planned ones are its own, and ``actor.backend``'s type lists exactly both."""
    import typing

    from areal_tasks.config.allocation import backends
    from areal_tasks.config.engine import EngineConfig

    assert registry.built_backends() == backends.BUILT_TRAINING_BACKENDS
    for name in registry.built_backends():
        assert backends.ALLOWED_DIMS[name] == registry.supported_dims(name)
    assert not set(backends.PLANNED_TRAINING_BACKENDS) & set(registry.built_backends())
    hint = typing.get_type_hints(EngineConfig)["backend"]
    assert set(typing.get_args(hint)) == set(backends.TRAINING_BACKENDS)
