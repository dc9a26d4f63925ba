"""Fault tests with real processes (issue #26, item 7): everything on loopback, every wait bounded.

Each test starts what it kills (servers, jobs, reward workers) and stops it by PID or process group
in a ``finally``; each is time-bounded with ``pytest.mark.timeout``. They print their timings
(``[fault-timing] ...`` lines, run with ``-s`` to see them) for the reliability table of
``docs/security.md``; nothing asserts a wall-clock time.
"""

from __future__ import annotations
