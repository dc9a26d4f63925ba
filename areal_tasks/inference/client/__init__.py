"""The inference client: one shared core (``core.py``) and a thin protocol adapter per backend.

``make_adapter(backend)`` gives the adapter of a backend of the inference registry
(:mod:`areal_tasks.inference.registry`: ``sglang``, ``embedded``, ``vllm``);
``RemoteInferenceEngine(addresses, adapter, ClientConfig(...))`` (or
``RemoteInferenceEngine.from_rollout(cfg.rollout, addresses)``) is the engine rollout code uses.
"""

from areal_tasks.inference.client.config import ClientConfig
from areal_tasks.inference.client.core import InflightRequest, RemoteInferenceEngine
from areal_tasks.inference.client.protocol import GenerateInput, GenerateOutput, HttpCall, ProtocolAdapter
from areal_tasks.inference.registry import make_adapter

__all__ = [
    "ClientConfig",
    "GenerateInput",
    "GenerateOutput",
    "HttpCall",
    "InflightRequest",
    "ProtocolAdapter",
    "RemoteInferenceEngine",
    "make_adapter",
]
