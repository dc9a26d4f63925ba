"""Fixtures of the shared inference protocol suite: one running server per registered backend.

Every test that takes the ``backend`` fixture runs once per registered backend and gets
``(client, control)``: a fresh :class:`~areal_tasks.inference.client.RemoteInferenceEngine` and the
:class:`ServerControl` of a session-scoped running server.

Registering a backend (in its own file, no edit here): add ``tests/integration/inference/
backend_<name>.py`` that calls :func:`register_backend` at import time with a :class:`BackendSpec`.
This conftest imports every ``backend_*.py`` beside it. ``start(workdir, model_dir)`` is a context
manager that starts the server(s), yields a ServerControl, and stops them on exit. Use ``marks``
to skip a backend where it cannot run (e.g. ``pytest.mark.skipif(not vllm_installed)``) and
``features`` to declare optional protocol features the suite may test (see ``FEATURES``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

logger = logging.getLogger(__name__)

#: optional features: ``collective`` (update over a torch.distributed group),
#: ``server_versions`` (the server reports the weight version of every token),
#: ``shared`` (update from the trainer's shared-memory buffer on the same host).
FEATURES = frozenset({"collective", "server_versions", "shared"})


@dataclass
class ServerControl:
    """Out-of-band handle on the running server(s) of one backend."""

    backend: str
    addresses: list[str]
    model_path: Path
    workdir: Path
    features: frozenset[str] = frozenset()
    #: extra keyword arguments of the backend's adapter (e.g. a served model name).
    adapter_kwargs: dict[str, Any] = field(default_factory=dict)
    #: policy version of the weights the servers hold now (tests that update weights bump it).
    version: int = 0
    #: ``api_key``/``admin_api_key`` the client sends (a job's servers always have an admin key).
    client_keys: dict[str, str | None] = field(default_factory=dict, repr=False)

    def make_client(self, **config: Any):
        """A client over all servers of this backend, at the servers' current version."""
        from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter

        defaults = {"request_timeout_s": 120.0, "max_retries": 2, "retry_backoff_s": 0.05, **self.client_keys}
        cfg = ClientConfig(**{**defaults, **config})
        adapter = make_adapter(self.backend, **self.adapter_kwargs)
        return RemoteInferenceEngine(self.addresses, adapter, cfg, version=self.version)

    def write_weights(self, version: int, scale: float = 1.0) -> Path:
        """A disk update of ``version``: the model's weights times ``scale`` as sharded safetensors."""
        from areal_tasks.models.safetensors_dir import read_safetensors_dir, write_safetensors_shards
        from storage.atomic import atomic_directory

        state = read_safetensors_dir(self.model_path)
        target = self.workdir / f"weights-v{version}"
        with atomic_directory(target, on_exists="replace_owned") as staging:
            scaled = {k: (v * scale).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}
            write_safetensors_shards(
                scaled, staging, max_shard_bytes=max(1, sum(t.nbytes for t in state.values()) // 2)
            )
        return target


@dataclass(frozen=True)
class BackendSpec:
    """A backend of the protocol suite."""

    name: str
    start: Callable[[Path, Path], AbstractContextManager[ServerControl]]
    marks: tuple[Any, ...] = ()
    features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = set(self.features) - FEATURES
        if unknown:
            raise ValueError(f"backend {self.name}: unknown features {sorted(unknown)}; known: {sorted(FEATURES)}")


BACKENDS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> None:
    """Add a backend to the suite (call at import time of ``backend_<name>.py``)."""
    BACKENDS[spec.name] = spec


def _load_backend_modules() -> None:
    here = Path(__file__).parent
    for path in sorted(here.glob("backend_*.py")):
        name = f"inference_suite_{path.stem}"
        if name in sys.modules:
            continue
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)


sys.modules.setdefault("inference_suite", sys.modules[__name__])
if str(Path(__file__).parent) not in sys.path:  # helper modules beside this file (collective_sender)
    sys.path.insert(0, str(Path(__file__).parent))
_load_backend_modules()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "inference_server" in metafunc.fixturenames:
        params = [pytest.param(name, marks=spec.marks, id=name) for name, spec in sorted(BACKENDS.items())]
        metafunc.parametrize("inference_server", params, indirect=True, scope="session")


@pytest.fixture(scope="session")
def inference_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_qwen2: Path
) -> Iterator[ServerControl]:
    spec = BACKENDS[request.param]
    with spec.start(tmp_path_factory.mktemp(f"inference-{spec.name}"), tiny_qwen2) as control:
        control.features = frozenset(control.features or spec.features)
        yield control


@pytest.fixture
def backend(inference_server: ServerControl) -> Iterator[tuple[Any, ServerControl]]:
    """``(client, control)`` for one running backend. Scenarios run as ``run(coro)`` and open the
    client with ``async with client:`` so that its connections close with the event loop."""
    yield inference_server.make_client(), inference_server


def run(coro: Any) -> Any:
    """Run one test scenario (a coroutine) to completion."""
    return asyncio.run(coro)
