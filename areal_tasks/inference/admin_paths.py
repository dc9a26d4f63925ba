"""The admin endpoints of SGLang's native protocol, in one place for both ends of the wire.

SGLang marks these ``ADMIN_OPTIONAL``: with an ``admin_api_key`` set they need it (with only an
``api_key``, that key). The embedded server's key check (``server/auth.py``) guards exactly this
set, and the client (``client/transport.py``) sends the admin key to it (plus vLLM's control
endpoints). Torch-free: the client imports it.
"""

from __future__ import annotations

__all__ = ["EMBEDDED_ADMIN_PATHS", "SGLANG_ADMIN_PATHS", "SHARED_WEIGHTS_PATH", "SWAP_WEIGHTS_PATH"]

SGLANG_ADMIN_PATHS: frozenset[str] = frozenset(
    {
        "/pause_generation",
        "/continue_generation",
        "/update_weights_from_disk",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/begin_weight_update",
        "/end_weight_update",
        "/update_weights_from_distributed",
        "/update_weight_version",
        "/flush_cache",
        "/abort_request",
    }
)

#: the embedded server's extensions of the protocol: pause, load and resume in one request ...
SWAP_WEIGHTS_PATH = "/areal/swap_weights"
#: ... and a load from the trainer's shared-memory buffers (``areal_tasks/weights/shared.py``).
SHARED_WEIGHTS_PATH = "/areal/update_weights_from_shared"

#: what the embedded server guards: SGLang's admin endpoints plus its own extensions.
EMBEDDED_ADMIN_PATHS: frozenset[str] = SGLANG_ADMIN_PATHS | {SWAP_WEIGHTS_PATH, SHARED_WEIGHTS_PATH}
