"""The embedded server's adapter: the embedded server speaks SGLang's native protocol, so this is
SGLang's adapter under the backend name ``embedded``, plus the server's two extensions: a weight
update in one request (``/areal/swap_weights``: pause, load, resume), which saves four HTTP round
trips inside every update's pause, and a load from the trainer's shared-memory buffers
(``/areal/update_weights_from_shared``) for servers on the trainer's host."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from areal_tasks.inference.admin_paths import SHARED_WEIGHTS_PATH, SWAP_WEIGHTS_PATH
from areal_tasks.inference.client.protocol import HttpCall
from areal_tasks.inference.client.sglang import SGLangAdapter

if TYPE_CHECKING:
    from areal_tasks.api.inference import ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["EmbeddedAdapter"]


class EmbeddedAdapter(SGLangAdapter):
    """``areal serve`` (``areal_tasks.inference.server``): SGLang's protocol, field for field."""

    name = "embedded"

    def swap_weights(
        self, meta: WeightUpdateMeta, bucket: Sequence[ParamSpec] | None, mode: PauseMode, *, flush_cache: bool
    ) -> HttpCall | None:
        body: dict = {"mode": mode, "weight_version": str(meta.version), "flush_cache": flush_cache}
        if meta.type == "disk":
            body["model_path"] = meta.path
        else:
            if bucket is None:
                return None
            body.update(_described(bucket))
            if meta.type == "shared":
                body["shared_buffers"] = [dict(b) for b in meta.shared_buffers]
            else:
                body["group_name"] = meta.group_name
        return HttpCall("POST", SWAP_WEIGHTS_PATH, json=body)

    def update_weights_from_shared(
        self, meta: WeightUpdateMeta, layout: Sequence[ParamSpec], *, flush_cache: bool = True
    ) -> HttpCall | None:
        body = {
            "shared_buffers": [dict(b) for b in meta.shared_buffers],
            "weight_version": str(meta.version),
            "flush_cache": flush_cache,
            "abort_all_requests": False,
            **_described(layout),
        }
        return HttpCall("POST", SHARED_WEIGHTS_PATH, json=body)


def _described(specs: Sequence[ParamSpec]) -> dict[str, list]:
    """``names``, ``dtypes`` and ``shapes`` of ``specs``, in order (how the server reads a flat buffer)."""
    return {
        "names": [p.name for p in specs],
        "dtypes": [p.dtype for p in specs],
        "shapes": [list(p.shape) for p in specs],
    }
