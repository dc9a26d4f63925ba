"""Third-party loggers that would log every request at INFO: kept at WARNING in every process we start.

httpx logs one INFO line per HTTP request; a rollout sends thousands a step, so left alone it floods
the logs and costs measurable time on the client's hot path. Call :func:`quiet_third_party_loggers`
once after configuring logging (the CLI, the train ranks, the rollout process and the benchmarks do).
"""

from __future__ import annotations

import logging

#: loggers set to WARNING: each logs per request or per connection at INFO/DEBUG.
NOISY_LOGGERS: tuple[str, ...] = ("httpx", "httpcore", "urllib3.connectionpool")


def quiet_third_party_loggers(level: int = logging.WARNING) -> None:
    """Raise :data:`NOISY_LOGGERS` to ``level`` (WARNING): their per-request lines are dropped."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)
