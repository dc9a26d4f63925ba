"""What one agent session may use of the proxy: :class:`ProxyLimits`, checked when built.

An agent the trainer does not control (a binary, a framework's runner) talks to the proxy; it
may loop forever, open requests in parallel, send huge bodies or simply vanish. Each limit keeps
one such agent from holding the proxy or the inference servers up for the others:

* ``max_concurrent_requests``: requests of one session in flight at once; one more is refused
  with 429 (the session stays usable);
* ``max_interactions``: completions one session may record; a request past it is refused with 429;
* ``idle_timeout_s`` / ``max_lifetime_s``: a session with no request for this long, or alive this
  long, ends itself with the rewards it has; its group is exported as any other, and its key then
  gets 401 saying the session expired;
* ``max_open_sessions``: ``start_session`` past it is refused with 429;
* ``max_body_bytes``: a larger request body is refused with 413 as it arrives;
* ``end_drain_timeout_s``: how long ending a session waits for its requests in flight before
  cancelling them (their completions are then not part of the group);
* ``max_group_wait_s``: the longest ``GET /rl/groups/next?timeout=`` may wait;
* ``max_ended_sessions``: ended sessions remembered (status, and the 401 that names why a key is
  refused); the oldest are forgotten first.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ProxyLimits"]


@dataclass(frozen=True)
class ProxyLimits:
    """Per-session and server-wide bounds of the agent proxy (see the module doc)."""

    max_concurrent_requests: int = 8
    max_interactions: int = 1024
    idle_timeout_s: float = 600.0
    max_lifetime_s: float = 3600.0
    max_open_sessions: int = 1024
    max_body_bytes: int = 16 * 1024 * 1024
    end_drain_timeout_s: float = 30.0
    max_group_wait_s: float = 300.0
    max_ended_sessions: int = 10_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                if not ok or value <= 0:
                    raise ConfigError(f"ProxyLimits.{f.name}={value!r} must be a finite number of seconds > 0")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"ProxyLimits.{f.name}={value!r} must be an int >= 1")

    @property
    def sweep_interval_s(self) -> float:
        """How often the sweeper looks for expired sessions: a tenth of the shorter timeout, in [0.05, 5] s."""
        return min(5.0, max(0.05, min(self.idle_timeout_s, self.max_lifetime_s) / 10))
