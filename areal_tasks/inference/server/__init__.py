"""The embedded inference server: any HF causal LM behind SGLang's HTTP protocol (plus OpenAI routes).

Layers, bottom up: ``sampling.py`` (parameters, batched sampler), ``kv_cache.py`` (slot KV cache),
``model_runner.py`` (forward passes), ``request.py`` (sequence state, finish rules), ``engine.py``
(continuous-batching loop thread), ``weight_service.py`` (weight updates, through the receivers
of ``areal_tasks.weights``), ``service.py`` (async operations), ``protocol.py`` / ``app.py`` /
``openai_routes.py`` (HTTP), ``auth.py``, ``metrics.py`` and ``server.py`` (build and run).
Importing this package is cheap; torch, transformers and FastAPI load with the modules that need them.
"""

from __future__ import annotations

from areal_tasks.inference.server.server import ServerConfig, WeightBounds, build_app, run_server

__all__ = ["ServerConfig", "WeightBounds", "build_app", "run_server"]
