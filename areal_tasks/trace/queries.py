"""Questions asked of a run's session trace (``<run_dir>/sessions.jsonl``), torch-free.

:func:`load_sessions` reads the lines (a path to the file or its run directory); the others take
what it returned, optionally narrowed by :func:`select` (status, trained-step range): how stale the
trained samples were (:func:`staleness_histogram`), why episodes were rejected or failed
(:func:`rejection_reasons`), how long the generation tail is (:func:`length_tail`,
:func:`longest`). A resumed job appends to the same file: an episode that was in flight at the
checkpoint appears again under a new id (its ``position`` and ``sample`` are the same); for a step
the job trained twice (killed after training, before its checkpoint), the lines written last are
those of the run that went on (:func:`latest_per_step` keeps only those).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from areal_tasks.api.run_dir import SESSIONS
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "Session",
    "latest_per_step",
    "length_tail",
    "load_sessions",
    "longest",
    "rejection_reasons",
    "select",
    "staleness_histogram",
]

#: one line of the trace (the schema in ``docs/tracing.md``).
Session = dict[str, Any]


def load_sessions(run_dir: str | os.PathLike[str]) -> list[Session]:
    """The trace's records in file order; ``run_dir`` is the run directory or the file itself.

    A missing file is an empty trace. A line that is not JSON (a writer killed mid-line, before the
    next writer cut it off) is skipped with a warning naming how many.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / SESSIONS
    if not path.exists():
        return []
    sessions: list[Session] = []
    bad = 0
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            text = raw.strip()
            if not text:
                continue
            try:
                sessions.append(json.loads(text))
            except json.JSONDecodeError:
                bad += 1
    if bad:
        logger.warning("%s: %d line(s) are not JSON and were skipped", path, bad)
    return sessions


def select(
    sessions: Iterable[Session],
    *,
    status: str | Sequence[str] | None = None,
    steps: tuple[int | None, int | None] | None = None,
) -> list[Session]:
    """The sessions with ``status`` (one or several) and, with ``steps=(first, last)`` (inclusive,
    either end None for open), trained in that step range (which leaves only accepted ones)."""
    wanted = None if status is None else {status} if isinstance(status, str) else set(status)
    out = []
    for s in sessions:
        if wanted is not None and s.get("status") not in wanted:
            continue
        if steps is not None:
            step = s.get("trained_step")
            first, last = steps
            if step is None or (first is not None and step < first) or (last is not None and step > last):
                continue
        out.append(s)
    return out


def latest_per_step(sessions: Sequence[Session]) -> list[Session]:
    """Accepted sessions, keeping for each trained step only the episodes of its last writer segment
    (a step trained twice across a kill and a resume keeps the second run's)."""
    last_segment: dict[int, str] = {}
    for s in sessions:
        if s.get("trained_step") is not None:
            last_segment[s["trained_step"]] = _segment(s)
    return [
        s for s in sessions if s.get("trained_step") is not None and last_segment.get(s["trained_step"]) == _segment(s)
    ]


def staleness_histogram(sessions: Iterable[Session]) -> dict[int, int]:
    """``{staleness: episodes}`` over the trained episodes, sorted (the trace's ``staleness_hist``)."""
    counts: Counter[int] = Counter(
        int(s["staleness"]) for s in sessions if s.get("trained_step") is not None and s.get("staleness") is not None
    )
    return dict(sorted(counts.items()))


def rejection_reasons(sessions: Iterable[Session], *, statuses: Sequence[str] = ("rejected", "failed")) -> Counter[str]:
    """How often each ``reason`` occurs among the ``rejected`` and ``failed`` episodes."""
    return Counter(str(s.get("reason")) for s in sessions if s.get("status") in statuses)


def length_tail(sessions: Iterable[Session], q: float = 0.99) -> int:
    """The ``q``-quantile (nearest rank) of ``n_output_tokens``; 0 for no sessions."""
    if not 0 <= q <= 1:
        raise ConfigError(f"q={q!r} must be in [0, 1]")
    lengths = sorted(int(s.get("n_output_tokens", 0)) for s in sessions)
    if not lengths:
        return 0
    rank = max(1, math.ceil(q * len(lengths)))
    return lengths[rank - 1]


def longest(sessions: Iterable[Session], n: int = 10) -> list[Session]:
    """The ``n`` sessions with the most output tokens, longest first."""
    return sorted(sessions, key=lambda s: int(s.get("n_output_tokens", 0)), reverse=True)[:n]


def _segment(session: Session) -> str:
    """The writer segment of a session (the last part of its episode id)."""
    return str(session.get("episode", "")).rsplit(".", 1)[-1]
