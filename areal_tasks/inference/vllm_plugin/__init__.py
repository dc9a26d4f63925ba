"""vLLM plugin of areal_tasks: CPU-capable weight-transfer engines for vLLM's RL endpoints.

vLLM 0.32 applies weight updates through a pluggable *weight-transfer engine* chosen at server start
(``--weight-transfer-config '{"backend": "<name>"}'``) and driven by the RL endpoints of its OpenAI
server (``VLLM_SERVER_DEV_MODE=1``): ``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update``. The engines it ships (NCCL, CUDA IPC) need a GPU;
this plugin adds ``areal`` (:mod:`.engine`), which works on CPU (and on GPU) and takes both kinds
of update our trainer publishes: the sharded HF safetensors of a directory
(``update_info = {"path": <dir>}``), and buckets broadcast over a gloo (or NCCL) group built like
SGLang's, which the embedded server also joins.

:func:`register` is the ``vllm.general_plugins`` entry point (see ``pyproject.toml``); vLLM calls it
in every process (API server, engine core, workers) before engines are created. Registration is
lazy: vLLM imports an engine module only when a server is started with that backend. This module
must not import vLLM or torch at import time (it is imported by the main package's tooling).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = ["ENGINES", "register"]

#: backend name -> (module, class) of the weight-transfer engines this plugin registers.
ENGINES: dict[str, tuple[str, str]] = {
    "areal": ("areal_tasks.inference.vllm_plugin.engine", "ArealWeightTransferEngine"),
}


def register() -> None:
    """Register :data:`ENGINES` with vLLM's ``WeightTransferEngineFactory`` (safe to call twice)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    for name, (module, class_name) in ENGINES.items():
        try:
            WeightTransferEngineFactory.register_engine(name, module, class_name)
        except ValueError:
            # vLLM refuses a second registration of a name; a repeated plugin load is expected
            # (vLLM documents that plugins may be loaded several times per process tree).
            logger.debug("vLLM weight-transfer engine %s was registered already", name)
            continue
        logger.info("registered vLLM weight-transfer engine %s -> %s.%s", name, module, class_name)
