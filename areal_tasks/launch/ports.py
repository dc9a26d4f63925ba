"""Free TCP ports on the loopback interface, never handed out twice by the same allocator.

A port is found by binding to port 0 and reading what the kernel chose; the socket is closed before
the worker binds it, so another program may still take it in between (a small window that no
pick-then-bind scheme avoids). A worker that then fails to bind exits, and the scheduler reports
that failure with its log instead of hanging.

``python -m areal_tasks.launch.ports --count N --host ADDR [--exclude P,P]`` prints N free ports of
ADDR on one line: a cluster scheduler runs it on the node where the worker will bind (the SLURM
scheduler through a short ``srun`` step), since a port is only known free where it is probed.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading

from areal_tasks.errors import SchedulerError

logger = logging.getLogger(__name__)

__all__ = ["PortAllocator", "main"]


class PortAllocator:
    """Hands out free ports on ``host``; the ports it holds are not reused until released."""

    def __init__(self, host: str = "127.0.0.1", max_attempts: int = 200) -> None:
        self.host = host
        self.max_attempts = max_attempts
        self._held: set[int] = set()
        self._lock = threading.Lock()

    def allocate(self, count: int) -> list[int]:
        """Return ``count`` distinct free ports and hold them until :meth:`release`."""
        ports: list[int] = []
        with self._lock:
            attempts = 0
            while len(ports) < count:
                attempts += 1
                if attempts > self.max_attempts:
                    self._held.difference_update(ports)
                    raise SchedulerError(
                        f"could not find {count} free ports on {self.host} after {self.max_attempts} "
                        f"attempts ({len(self._held)} held by this scheduler); stop unused groups or "
                        "widen the ephemeral port range (net.ipv4.ip_local_port_range)"
                    )
                port = self._probe()
                if port in self._held:
                    continue
                self._held.add(port)
                ports.append(port)
        logger.debug("allocated ports %s on %s", ports, self.host)
        return ports

    def release(self, ports: list[int]) -> None:
        """Return ``ports`` to the pool."""
        with self._lock:
            self._held.difference_update(ports)

    @property
    def held(self) -> frozenset[int]:
        """The ports currently held."""
        with self._lock:
            return frozenset(self._held)

    def _probe(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((self.host, 0))
            return int(sock.getsockname()[1])


def main(args: list[str] | None = None) -> int:
    """Print ``--count`` free ports of ``--host`` (none of ``--exclude``), space-separated."""
    parser = argparse.ArgumentParser(prog="python -m areal_tasks.launch.ports", description=main.__doc__)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--exclude", default="", help="comma-separated ports not to hand out (held elsewhere)")
    ns = parser.parse_args(args)
    allocator = PortAllocator(ns.host)
    allocator._held.update(int(p) for p in ns.exclude.split(",") if p.strip())
    try:
        ports = allocator.allocate(ns.count)
    except (SchedulerError, OSError) as exc:
        print(f"cannot pick {ns.count} ports on {ns.host}: {exc}", file=sys.stderr)
        return 1
    print(" ".join(str(p) for p in ports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
