"""The inference-backend registry: every inference backend, what it is made of and what it needs.

The one list of inference backends. Each :class:`InferenceBackend` names its client protocol
adapter (``inference/client/``) and its server launcher (``inference/launch/commands.py``) as
``"module:attr"`` paths, imported on first use, and states the facts that validation needs (the
allocation dims it accepts, whether it needs GPUs). The allocation grammar
(``config/allocation/backends.py``), config validation, ``RemoteInferenceEngine.from_rollout`` and
the server launcher all read it; ``rollout.backend``'s ``Literal`` is a type hint that a unit test
keeps equal to :func:`inference_backend_names`.

A new backend is one entry in the table below (the allocation grammar reads the names once, when
the config package is imported, and ``rollout.backend``'s ``Literal`` lists them). Torch-free and
light: it imports neither the client nor the launchers, so the config package (and with it the DAG
files) can import it at parse time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError
from areal_tasks.registry import Registry, load_target

if TYPE_CHECKING:
    from collections.abc import Callable

    from areal_tasks.inference.client.protocol import ProtocolAdapter
    from areal_tasks.inference.launch.commands import ServerArgs, ServerCommand

logger = logging.getLogger(__name__)

__all__ = [
    "INFERENCE_BACKENDS",
    "InferenceBackend",
    "gpu_only_inference_backends",
    "inference_backend",
    "inference_backend_names",
    "make_adapter",
    "server_command_builder",
]


@dataclass(frozen=True)
class InferenceBackend:
    """One inference backend: its implementations (import paths) and its constraints."""

    name: str
    #: ``"module:Class"`` of its client :class:`ProtocolAdapter`.
    adapter: str
    #: ``"module:function"`` that turns ``ServerArgs`` into the ``ServerCommand`` of one server.
    server_command: str
    #: it cannot run without GPUs (refused with ``cluster.gpus_per_node: 0``).
    needs_gpu: bool = False
    #: the allocation dims its components accept (``docs/allocation.md``).
    dims: str = "dtp"


_CLIENT = "areal_tasks.inference.client"
_LAUNCH = "areal_tasks.inference.launch.commands"

#: inference backend name -> :class:`InferenceBackend`.
INFERENCE_BACKENDS: Registry[InferenceBackend] = Registry(
    "inference backend",
    {
        backend.name: backend
        for backend in (
            InferenceBackend("embedded", f"{_CLIENT}.embedded:EmbeddedAdapter", f"{_LAUNCH}:embedded_command"),
            InferenceBackend("sglang", f"{_CLIENT}.sglang:SGLangAdapter", f"{_LAUNCH}:sglang_command", needs_gpu=True),
            InferenceBackend("vllm", f"{_CLIENT}.vllm:VLLMAdapter", f"{_LAUNCH}:vllm_command"),
        )
    },
    error=ConfigError,
)


def inference_backend_names() -> tuple[str, ...]:
    """Every registered inference backend, sorted."""
    return INFERENCE_BACKENDS.names()


def inference_backend(name: str) -> InferenceBackend:
    """The backend ``name``; a ConfigError names the closest one and the full list."""
    return INFERENCE_BACKENDS.get(name)


def gpu_only_inference_backends() -> frozenset[str]:
    """The inference backends that cannot run on CPU."""
    return frozenset(name for name in inference_backend_names() if inference_backend(name).needs_gpu)


def make_adapter(name: str, **kwargs: Any) -> ProtocolAdapter:
    """An adapter instance for backend ``name``; ``kwargs`` go to its constructor."""
    adapter = load_target(inference_backend(name).adapter, f"client adapter of inference backend {name!r}")
    return adapter(**kwargs)


def server_command_builder(name: str) -> Callable[[ServerArgs], ServerCommand]:
    """The function that builds the command line of one ``name`` server."""
    return load_target(inference_backend(name).server_command, f"server launcher of inference backend {name!r}")
