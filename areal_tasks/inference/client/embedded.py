"""The embedded server's adapter: the embedded server speaks SGLang's native protocol, so this is
SGLang's adapter under the backend name ``embedded`` (one place to put a divergence, should one
ever be needed; today there is none)."""

from __future__ import annotations

import logging

from areal_tasks.inference.client.sglang import SGLangAdapter

logger = logging.getLogger(__name__)

__all__ = ["EmbeddedAdapter"]


class EmbeddedAdapter(SGLangAdapter):
    """``areal serve`` (``areal_tasks.inference.server``): SGLang's protocol, field for field."""

    name = "embedded"
