"""The rollout executor's settings check: every bad value named, with what is allowed, in one error.

A batch holds whole groups (``batch_size`` a positive multiple of ``group_size``), a group's
episodes run together (``max_concurrent_rollouts >= group_size``), ``max_head_offpolicyness`` is an
int >= 0 (0 = synchronous), ``staleness_bound`` one of the bounds, ``max_failure_rate`` in [0, 1].
"""

from __future__ import annotations

from areal_tasks.errors import ConfigError
from areal_tasks.rollout.staleness import STALENESS_BOUNDS

__all__ = ["check_executor_settings"]


def check_executor_settings(
    batch_size: int,
    group_size: int,
    max_concurrent: int,
    eta: int,
    max_failure_rate: float,
    failure_window: int,
    version: int,
    staleness_bound: str,
) -> None:
    """Raise :class:`ConfigError` naming every invalid setting."""

    def is_int(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    problems = []
    if not is_int(group_size) or group_size < 1:
        problems.append(f"group_size={group_size!r} must be an int >= 1")
    elif not is_int(batch_size) or batch_size < 1 or batch_size % group_size:
        problems.append(
            f"batch_size={batch_size!r} must be a positive multiple of group_size={group_size} "
            "(a batch holds whole groups)"
        )
    if is_int(group_size) and (not is_int(max_concurrent) or max_concurrent < group_size):
        problems.append(
            f"max_concurrent_rollouts={max_concurrent!r} must be >= group_size={group_size}: the "
            "episodes of a group run concurrently, so a whole group must fit (raise "
            "rollout.max_concurrent_rollouts)"
        )
    if not is_int(eta) or eta < 0:
        problems.append(f"max_head_offpolicyness={eta!r} must be an int >= 0 (0 = synchronous)")
    if staleness_bound not in STALENESS_BOUNDS:
        problems.append(
            f"staleness_bound={staleness_bound!r} must be one of "
            f"{', '.join(map(repr, STALENESS_BOUNDS))} (what max_head_offpolicyness bounds)"
        )
    if not isinstance(max_failure_rate, (int, float)) or not 0 <= max_failure_rate <= 1:
        problems.append(f"max_failure_rate={max_failure_rate!r} must be in [0, 1]")
    if not is_int(failure_window) or failure_window < 1:
        problems.append(f"failure_window={failure_window!r} must be an int >= 1")
    if not is_int(version) or version < 0:
        problems.append(f"version={version!r} must be an int >= 0")
    if problems:
        raise ConfigError("invalid rollout executor settings: " + "; ".join(problems))
