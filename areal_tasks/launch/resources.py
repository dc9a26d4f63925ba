"""This machine's resources against what an allocation needs: CPUs, GPUs, memory, free loopback ports.

One check, used by the local scheduler's preflight (``areal train`` before anything starts) and by the
Airflow local cluster hook (``provision_cluster``). It returns a report that lists every shortage
(``problems``) and every soft concern (``warnings``, e.g. more processes than cores); the caller
decides how to fail, so each entry point raises its own error type with all the problems at once.

Torch-free.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from areal_tasks.errors import SchedulerError

logger = logging.getLogger(__name__)

__all__ = ["available_memory_gb", "check_local_resources"]


def available_memory_gb() -> float | None:
    """``MemAvailable`` in GB (10^9 bytes) from /proc/meminfo; None where there is none."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return None


def check_local_resources(allocation_mode: str, n_gpus: int = 0, min_memory_gb: float = 1.0) -> dict[str, Any]:
    """CPUs, GPUs, memory and free loopback ports for ``allocation_mode`` on this machine.

    ``n_gpus=0`` is a CPU run: the allocation's world sizes count processes. With ``n_gpus > 0``
    the allocation's GPUs must fit in ``n_gpus`` and in the GPUs this machine shows. Memory is
    compared with ``MemAvailable``. One port per inference server plus one rendezvous port per
    training component must be free. Oversubscribed CPUs are a warning, not a failure.

    Returns the report (``ok`` is False when ``problems`` is not empty). Raises
    :class:`~areal_tasks.errors.AllocationError` for an allocation that does not parse and
    ValueError for a negative ``n_gpus``.
    """
    from areal_tasks.config.allocation import parse_allocation
    from areal_tasks.launch.devices import detect_devices
    from areal_tasks.launch.ports import PortAllocator

    if n_gpus < 0:
        raise ValueError(f"n_gpus={n_gpus} must be >= 0 (0 = CPU only)")
    alloc = parse_allocation(allocation_mode)
    processes = sum(c.world_size for c in alloc.components)
    cpus = len(os.sched_getaffinity(0))
    devices = detect_devices()
    memory_gb = available_memory_gb()
    problems: list[str] = []
    warnings: list[str] = []
    gpus_needed = alloc.total_gpus if n_gpus > 0 else 0
    if n_gpus > 0:
        if gpus_needed > n_gpus:
            problems.append(
                f"allocation {allocation_mode!r} needs {gpus_needed} GPUs but n_gpus={n_gpus}; "
                "raise n_gpus or shrink the allocation"
            )
        if len(devices) < gpus_needed:
            problems.append(
                f"allocation {allocation_mode!r} needs {gpus_needed} GPUs but this machine shows "
                f"{len(devices)} ({','.join(devices) or 'none'}); run on a bigger machine, "
                "shrink the allocation, or set n_gpus=0 for a CPU run"
            )
    elif processes > cpus:
        warnings.append(f"{processes} processes on {cpus} CPU core(s): oversubscribed, expect a slow run")
    if memory_gb is not None and memory_gb < min_memory_gb:
        problems.append(
            f"{memory_gb:.1f} GB of memory available, {min_memory_gb:.1f} GB required; "
            "stop other jobs or lower the memory asked for"
        )
    n_ports = sum(c.world_size for c in alloc.inference()) + len(alloc.training())
    allocator = PortAllocator()
    try:
        allocator.release(allocator.allocate(n_ports))
    except SchedulerError as exc:
        problems.append(f"{n_ports} free loopback ports needed: {exc}")
    return {
        "allocation": alloc.spec,
        "processes": processes,
        "cpus": cpus,
        "gpus_detected": len(devices),
        "gpus_needed": gpus_needed,
        "memory_available_gb": None if memory_gb is None else round(memory_gb, 2),
        "min_memory_gb": min_memory_gb,
        "ports_checked": n_ports,
        "warnings": warnings,
        "problems": problems,
        "ok": not problems,
    }
