"""Weight-update mode name (``rollout.weight_update``) -> its transport class.

Torch-free: the entries are import paths, loaded on first use, so config validation can list and
check the names without importing a transport. The trainer chooses its transport here once per run
(:func:`build_transport`); every other list of modes (validation, docs) is derived from
:data:`WEIGHT_TRANSPORTS`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from areal_tasks.errors import ConfigError
from areal_tasks.registry import Registry

if TYPE_CHECKING:
    from areal_tasks.api.weights import WeightSource
    from areal_tasks.weights.base import PublishContext, WeightTransport

logger = logging.getLogger(__name__)

__all__ = ["WEIGHT_TRANSPORTS", "build_transport", "transport_class"]

WEIGHT_TRANSPORTS: Registry[type[WeightTransport]] = Registry(
    "weight transport (rollout.weight_update)",
    {
        "disk": "areal_tasks.weights.disk:DiskTransport",
        "collective": "areal_tasks.weights.collective:CollectiveTransport",
        "shared": "areal_tasks.weights.shared:SharedTransport",
    },
    error=ConfigError,
)


def transport_class(name: str) -> type[WeightTransport]:
    """The transport class of mode ``name``; an unknown name is a ConfigError naming the known ones."""
    return WEIGHT_TRANSPORTS.get(name)


def build_transport(name: str, source: WeightSource, context: PublishContext) -> WeightTransport:
    """The trainer's transport of mode ``name`` for ``source`` (one per run)."""
    transport = transport_class(name)(source, context)
    logger.info("weight updates through the %s transport", name)
    return transport
