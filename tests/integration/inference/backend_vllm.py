"""The vLLM backend of the protocol suite: a real vLLM CPU server (``.venv-vllm``, ``make vllm-env``).

The server is the session's shared one (``tests/integration/vllm/vllm_test_server.py``), started
with our weight-transfer plugin, so it takes disk and gloo collective updates. It serves a tiny
qwen2 with 32-wide heads (vLLM's CPU attention has no 16-wide kernels) instead of the suite's
default tiny model; ``ServerControl.model_path`` names it, so the suite writes weights of that model.
vLLM reports the weight version of the last update (``/weight_info``), not per token.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from inference_suite import BackendSpec, ServerControl, register_backend

_VLLM_TESTS = Path(__file__).resolve().parents[1] / "vllm"
if str(_VLLM_TESTS) not in sys.path:
    sys.path.insert(0, str(_VLLM_TESTS))

import vllm_test_server  # noqa: E402 - importable only once its folder is on sys.path (above)


@contextlib.contextmanager
def start_vllm(workdir: Path, model_dir: Path) -> Iterator[ServerControl]:
    del model_dir  # the suite's default tiny model has 16-wide heads, which vLLM's CPU backend lacks
    with vllm_test_server.shared_vllm_server(workdir) as server:
        yield ServerControl(
            "vllm",
            [server.address],
            server.model_path,
            workdir,
            adapter_kwargs={"model": vllm_test_server.SERVED_NAME},
            version=server.reported_version() or 0,
            client_keys={"api_key": server.api_key or None},
        )


_missing = vllm_test_server.vllm_missing_reason()
register_backend(
    BackendSpec(
        "vllm",
        start_vllm,
        marks=(pytest.mark.skipif(_missing is not None, reason=_missing or ""),),
        features=frozenset({"collective"}),
    )
)
