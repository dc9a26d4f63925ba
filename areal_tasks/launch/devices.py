"""The pool of accelerator ids a LocalScheduler hands out through ``CUDA_VISIBLE_DEVICES``.

A worker's own ids come first in its ``CUDA_VISIBLE_DEVICES`` and the pool's other ids after them
(:meth:`DevicePool.visible_to`; ``AREAL_OWN_DEVICES`` says how many are its own), so NCCL between
two workers can use the direct GPU-to-GPU path.

The pool is given explicitly, or taken from the controller's own ``CUDA_VISIBLE_DEVICES``, or, when
that is unset, from ``nvidia-smi -L`` if it is on PATH; on a CPU machine it is empty.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading

from areal_tasks.errors import SchedulerError

logger = logging.getLogger(__name__)

__all__ = ["DevicePool", "detect_devices"]


def detect_devices() -> list[str]:
    """The accelerator ids visible to this process (empty on a CPU machine)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    result = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        logger.warning("nvidia-smi -L failed (exit %s): %s; assuming no GPUs", result.returncode, result.stderr)
        return []
    return [str(i) for i, line in enumerate(result.stdout.splitlines()) if line.startswith("GPU ")]


class DevicePool:
    """Hands out device ids; each id goes to at most one worker at a time (a colocated worker may
    share ids another worker holds: :meth:`check_held`)."""

    def __init__(self, devices: list[str]) -> None:
        self._all = list(devices)
        self._free = list(devices)
        self._lock = threading.Lock()

    def acquire(self, count: int, owner: str) -> list[str]:
        """Take ``count`` ids for ``owner`` (a worker name); SchedulerError if too few are free."""
        with self._lock:
            if count > len(self._free):
                raise SchedulerError(
                    f"{owner} needs {count} device(s) but only {len(self._free)} of {len(self._all)} "
                    f"({','.join(self._all) or 'none'}) are free; stop a group, lower devices_per_worker, "
                    "or pass devices=[...] to the scheduler"
                )
            taken, self._free = self._free[:count], self._free[count:]
        return taken

    def check_held(self, devices: list[str], owner: str) -> list[str]:
        """``devices`` for ``owner`` to share (colocation): every id must be in the pool and held
        by a worker now; SchedulerError otherwise. Nothing is taken from the pool."""
        with self._lock:
            unknown = [d for d in devices if d not in self._all]
            free = [d for d in devices if d in self._free]
        if unknown or free:
            raise SchedulerError(
                f"{owner} was to share device(s) {','.join(devices)}, but "
                + (
                    f"{','.join(unknown)} are not in the pool ({','.join(self._all) or 'none'})"
                    if unknown
                    else f"{','.join(free)} are held by no worker"
                )
                + "; start the group that holds them first"
            )
        return list(devices)

    def release(self, devices: list[str]) -> None:
        """Give ``devices`` back, keeping the pool's original order."""
        with self._lock:
            returned = set(self._free) | set(devices)
            self._free = [d for d in self._all if d in returned]

    def visible_to(self, own: list[str]) -> list[str]:
        """``CUDA_VISIBLE_DEVICES`` of a worker holding ``own``: those first, then the pool's other ids."""
        return list(own) + [d for d in self._all if d not in own]

    @property
    def size(self) -> int:
        """How many ids the pool holds, free or not."""
        return len(self._all)

    @property
    def free(self) -> list[str]:
        """The ids not held by any worker."""
        with self._lock:
            return list(self._free)
