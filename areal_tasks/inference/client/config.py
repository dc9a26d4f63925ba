"""``ClientConfig``: the knobs of the shared client core (timeouts, retries, balancing, caps)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.rollout import RolloutConfig

logger = logging.getLogger(__name__)

__all__ = ["ClientConfig"]


@dataclass(frozen=True)
class ClientConfig:
    """How the client talks to its servers."""

    #: seconds one generate attempt may take (the whole HTTP exchange).
    request_timeout_s: float = 600.0
    #: retries of a failed generate attempt (connection error, timeout, 408/429/5xx) before giving up.
    max_retries: int = 3
    #: first backoff before a retry; doubles each retry up to ``max_backoff_s``.
    retry_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    #: relative random spread of each backoff (0 = exact doubling).
    retry_jitter: float = 0.1
    #: generate requests in flight at once over all servers (the concurrency cap).
    max_concurrent: int = 32
    #: seconds to open a connection.
    connect_timeout_s: float = 10.0
    #: seconds the abort of an abandoned generate attempt may take (sent in the background).
    abort_timeout_s: float = 5.0
    #: seconds a pause/resume/health/info call may take.
    control_timeout_s: float = 60.0
    #: seconds a disk weight update may take on a server.
    update_timeout_s: float = 600.0
    #: seconds a server that refused connections is avoided (doubles per consecutive failure, x32 at most).
    dead_cooldown_s: float = 2.0
    #: resubmissions of one request (pauses, aborts) before it fails.
    max_resubmits: int = 64
    #: collective-group ranks each server holds (its tensor-parallel size).
    ranks_per_server: int = 1

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("max_retries", "retry_jitter"):
                ok = value >= 0
            else:
                ok = value > 0
            if not ok:
                problems.append(f"{f.name}={value!r} must be {'>= 0' if f.name in ('max_retries', 'retry_jitter') else '> 0'}")
        if self.retry_jitter >= 1:
            problems.append(f"retry_jitter={self.retry_jitter!r} must be < 1")
        if problems:
            raise ConfigError("invalid ClientConfig: " + "; ".join(problems))

    @classmethod
    def from_rollout(cls, cfg: RolloutConfig, ranks_per_server: int = 1) -> ClientConfig:
        """The client settings of a ``rollout`` config section (``ranks_per_server`` = inference TP)."""
        return cls(
            request_timeout_s=cfg.request_timeout_s,
            max_retries=cfg.max_retries,
            max_concurrent=cfg.max_concurrent_rollouts,
            ranks_per_server=ranks_per_server,
        )
