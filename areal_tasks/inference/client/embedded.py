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
from areal_tasks.inference.client.protocol import HttpCall, described
from areal_tasks.inference.client.sglang import SGLangAdapter

if TYPE_CHECKING:
    from areal_tasks.api.inference import ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["EmbeddedAdapter"]

#: the loads ``/areal/swap_weights`` can stand for (one flattened bucket for a distributed one) ...
_SWAPPABLE_LOADS = frozenset({"/update_weights_from_disk", "/update_weights_from_distributed", SHARED_WEIGHTS_PATH})
#: ... and the fields of their bodies it takes (abort_all_requests and load_format are its own).
_SWAP_LOAD_FIELDS = frozenset(
    {"model_path", "group_name", "shared_buffers", "names", "dtypes", "shapes", "weight_version", "flush_cache"}
)


class EmbeddedAdapter(SGLangAdapter):
    """``areal serve`` (``areal_tasks.inference.server``): SGLang's protocol, field for field."""

    name = "embedded"

    def swap_weights(self, meta: WeightUpdateMeta, load: HttpCall, mode: PauseMode) -> HttpCall | None:
        """``/areal/swap_weights``: the pause ``mode`` and the fields of the ``load`` it stands for
        (its disk, distributed or shared body: the server tells the kind by them)."""
        del meta
        if load.path not in _SWAPPABLE_LOADS or load.json is None:
            return None
        fields = {k: v for k, v in load.json.items() if k in _SWAP_LOAD_FIELDS}
        return HttpCall("POST", SWAP_WEIGHTS_PATH, json={"mode": mode, **fields})

    def update_weights_from_shared(
        self, meta: WeightUpdateMeta, layout: Sequence[ParamSpec], *, flush_cache: bool = True
    ) -> HttpCall | None:
        body = {
            "shared_buffers": [dict(b) for b in meta.shared_buffers],
            "weight_version": str(meta.version),
            "flush_cache": flush_cache,
            "abort_all_requests": False,
            **described(layout),
        }
        return HttpCall("POST", SHARED_WEIGHTS_PATH, json=body)
