"""``ClientConfig``: the knobs of the shared client core (timeouts, retries, balancing, caps, keys).

The API keys are secrets: they are kept out of ``repr`` and out of every error message.
:meth:`ClientConfig.from_rollout` reads them from the environment variables that
``rollout.server.api_key_env``/``admin_api_key_env`` name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
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
    #: sent as ``Authorization: Bearer <api_key>`` on every call (None = no header).
    api_key: str | None = field(default=None, repr=False)
    #: sent instead of ``api_key`` on admin calls: pause/resume, weight updates, aborts (None = use ``api_key``).
    admin_api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        problems = [problem for name in _KEY_FIELDS if (problem := _key_problem(name, getattr(self, name)))]
        for f in fields(self):
            if f.name in _KEY_FIELDS:
                continue
            value = getattr(self, f.name)
            ok = value >= 0 if f.name in ("max_retries", "retry_jitter") else value > 0
            if not ok:
                problems.append(
                    f"{f.name}={value!r} must be {'>= 0' if f.name in ('max_retries', 'retry_jitter') else '> 0'}"
                )
        if self.retry_jitter >= 1:
            problems.append(f"retry_jitter={self.retry_jitter!r} must be < 1")
        if problems:
            raise ConfigError("invalid ClientConfig: " + "; ".join(problems))

    @classmethod
    def from_rollout(
        cls, cfg: RolloutConfig, ranks_per_server: int = 1, environ: Mapping[str, str] | None = None
    ) -> ClientConfig:
        """The client settings of a ``rollout`` config section (``ranks_per_server`` = inference TP).

        The keys come from the variables ``rollout.server.api_key_env``/``admin_api_key_env`` name,
        or the job's generated server key (:meth:`InferenceServerConfig.key_envs`), looked up in
        ``environ`` (default ``os.environ``); ConfigError names a configured variable that is unset.
        """
        api_key, admin_api_key = cfg.server.read_keys(os.environ if environ is None else environ, cfg.backend)
        return cls(
            request_timeout_s=cfg.request_timeout_s,
            max_retries=cfg.max_retries,
            max_concurrent=cfg.max_concurrent_rollouts,
            ranks_per_server=ranks_per_server,
            api_key=api_key,
            admin_api_key=admin_api_key,
        )


#: the fields that hold secrets (validated apart, never printed).
_KEY_FIELDS = ("api_key", "admin_api_key")


def _key_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be sent as a bearer token, described without showing it (it is a secret)."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"{name} must be a string or None, got a {type(value).__name__}"
    if not value or not all(33 <= ord(c) <= 126 for c in value):
        return (
            f"{name} must be a non-empty string of printable ASCII without spaces (a bearer token); "
            f"got {len(value)} characters (a trailing newline from a file or `echo`?)"
        )
    return None
