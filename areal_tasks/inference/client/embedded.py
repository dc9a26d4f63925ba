"""The embedded server's adapter: the embedded server speaks SGLang's native protocol, so this is
SGLang's adapter under the backend name ``embedded``, plus the server's one extension: a weight
update in one request (``/areal/swap_weights``: pause, load, resume), which saves four HTTP round
trips inside every update's pause."""

from __future__ import annotations

import logging

from collections.abc import Sequence
from typing import TYPE_CHECKING

from areal_tasks.inference.admin_paths import SWAP_WEIGHTS_PATH
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
            body.update(group_name=meta.group_name, names=[p.name for p in bucket], dtypes=[p.dtype for p in bucket],
                        shapes=[list(p.shape) for p in bucket])  # fmt: skip
        return HttpCall("POST", SWAP_WEIGHTS_PATH, json=body)
