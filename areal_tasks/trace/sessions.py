"""The session tracer: one JSON line per rollout episode, written once the episode is final.

An episode's life: admitted (a group of ``group_size`` episodes of one prompt starts at the
trainer's version), generated (one or more generate calls, each possibly aborted and resubmitted
across a weight update), scored, and then one of:

- ``accepted``: its group passed, was handed to the trainer in a batch, and the trainer said it
  trained that batch at step ``s`` (``trained_step``; ``staleness`` is the project's definition,
  the trainer version when the batch was returned minus the oldest version among the episode's
  generated tokens: the number ``rollout/staleness_*`` and ``staleness_hist`` count);
- ``rejected``: its group was dropped, by the group filter or because an episode of it returned
  None (``reason`` says why: ``group filter: all rewards equal (0)``, ``prompt too long``,
  ``empty output``, ``group rejected: sample 1 failed``...);
- ``failed``: the episode raised (``reason``: the exception);
- ``dropped``: it was still running, waiting or handed to the trainer without being trained when
  the executor stopped or failed.

:class:`SessionRecorder` lives where the episodes live, beside the executor's groups (in the
rollout process when ``rollout.own_process`` puts it there), so one process writes the file and
every line is whole. The executor feeds it (admission, each episode's end, the group's outcome,
the batch handed out), the RL loop through the executor protocol (``mark_trained(step)``). Lines
are buffered and flushed at every ``mark_trained`` (a step boundary), when many are waiting, and at
:meth:`SessionRecorder.close`; a partial last line left by a killed process is cut off when the
next writer opens the file. The per-call facts come from the episode's engine
(:class:`~areal_tasks.rollout.episodes.EpisodeEngine` records one dict per generate call, from the
response's lengths, first and last token versions and resubmissions: no per-token work); the reward
timings and a workflow's reason for returning None come through a context variable the episode's
task carries (:func:`timed_reward`, :func:`note_rejection`), so workflows and rewards need not know
the recorder. Torch-free. The schema is in ``docs/tracing.md`` (the session tracer section).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

__all__ = [
    "EpisodeSession",
    "SessionRecorder",
    "SessionStatus",
    "bind",
    "current_session",
    "filter_reason",
    "note_rejection",
    "timed_reward",
]

#: an episode's final state.
SessionStatus = Literal["accepted", "rejected", "failed", "dropped"]
#: lines kept in memory before a write (besides the step boundaries and close).
_FLUSH_LINES = 1024
#: longest ``reason`` kept (exception messages can be long).
_REASON_CHARS = 300

_CURRENT: contextvars.ContextVar[EpisodeSession | None] = contextvars.ContextVar("areal_session", default=None)


@dataclass(eq=False)
class EpisodeSession:
    """One episode's record while it lives (see the module docstring for the fields' meaning)."""

    episode: str
    group: str
    #: ``[data epoch, dataset index]``: the same identity as ``rollout_episodes.jsonl``'s ids.
    position: list[int]
    sample: int
    admitted_t: float
    admitted_version: int
    #: the prompt's place in its epoch's order (the data source's position).
    order: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    reward_t0: float | None = None
    reward_t1: float | None = None
    status: SessionStatus | None = None
    reason: str | None = None
    trained_step: int | None = None
    staleness: int | None = None
    #: the trainer version when the batch holding the episode was returned.
    handed_version: int | None = None
    end_t: float | None = None
    #: what a workflow said when it returned None (:func:`note_rejection`).
    note: str | None = None
    #: whether the episode's task has finished (its calls are all in).
    ended: bool = False

    @property
    def n_output_tokens(self) -> int:
        return sum(int(c.get("out_tokens", 0)) for c in self.calls)

    def to_json(self) -> dict[str, Any]:
        """The JSON line's object (the schema of ``docs/tracing.md``)."""
        return {
            "episode": self.episode,
            "group": self.group,
            "position": list(self.position),
            "order": self.order,
            "sample": self.sample,
            "admitted_t": self.admitted_t,
            "admitted_version": self.admitted_version,
            "calls": list(self.calls),
            "reward": self.reward,
            "reward_t0": self.reward_t0,
            "reward_t1": self.reward_t1,
            "status": self.status,
            "reason": self.reason,
            "trained_step": self.trained_step,
            "staleness": self.staleness,
            "handed_version": self.handed_version,
            "n_output_tokens": self.n_output_tokens,
            "end_t": self.end_t,
        }


class SessionRecorder:
    """Writes one line per final episode to ``path`` (None: records nothing; every method is cheap).

    Thread-safe: the executor's event loop feeds it, the trainer's thread calls :meth:`trained`
    and :meth:`close`. ``segment`` tells the episodes of this executor from those of an earlier
    process of the same run (a resumed job replays the prompts that were in flight): episode ids
    are ``<epoch>.<dataset index>.<sample>.<segment>``.
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, segment: str | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.segment = segment or secrets.token_hex(3)
        self._lock = threading.Lock()
        self._lines: list[str] = []
        #: sessions not written yet, by id (for close: what is left is dropped).
        self._open: dict[int, EpisodeSession] = {}
        #: batches handed to the trainer, oldest first, waiting for :meth:`trained`.
        self._handed: deque[list[EpisodeSession]] = deque()
        self._handle: Any = None
        self._closed = False
        #: lines written so far.
        self.written = 0

    @property
    def enabled(self) -> bool:
        return self.path is not None and not self._closed

    # ------------------------------------------------------------------ the executor's side (its loop)

    def open_episode(
        self, *, epoch: int, data_index: int, order: int, sample: int, group_seq: int, version: int
    ) -> EpisodeSession | None:
        """A new episode admitted at trainer version ``version`` (None when the recorder is off)."""
        if not self.enabled:
            return None
        group = f"{epoch}.{data_index}.{self.segment}.g{group_seq}"
        session = EpisodeSession(
            episode=f"{epoch}.{data_index}.{sample}.{self.segment}",
            group=group,
            position=[epoch, data_index],
            sample=sample,
            admitted_t=time.time(),
            admitted_version=version,
            order=order,
        )
        with self._lock:
            self._open[id(session)] = session
        return session

    def open_group(
        self, *, epoch: int, data_index: int, order: int, size: int, group_seq: int, version: int
    ) -> list[EpisodeSession | None]:
        """The ``size`` episodes of a group admitted at ``version``."""
        return [
            self.open_episode(
                epoch=epoch, data_index=data_index, order=order, sample=i, group_seq=group_seq, version=version
            )
            for i in range(size)
        ]

    def drop(self, sessions: Iterable[EpisodeSession | None], reason: str) -> None:
        """The executor stopped or failed: these episodes (running, or accepted and not taken) are dropped."""
        for session in sessions:
            if session is None:
                continue
            with self._lock:
                if session.status == "accepted":
                    session.status = None  # not trained after all
            self.settle(session, "dropped", reason)

    def ended(self, session: EpisodeSession | None, calls: list[dict[str, Any]], reward: float | None) -> None:
        """The episode's task finished (returned, raised or was cancelled) with these calls."""
        if session is None:
            return
        with self._lock:
            session.calls = calls
            if reward is not None:
                session.reward = float(reward)
            session.end_t = time.time()
            session.ended = True
            if session.status is not None and session.status != "accepted":
                self._emit(session)

    def settle(self, session: EpisodeSession | None, status: SessionStatus, reason: str | None = None) -> None:
        """The episode's outcome: ``accepted`` waits for training; the others are written once it ended."""
        if session is None:
            return
        with self._lock:
            if session.status is not None:
                return
            session.status = status
            session.reason = None if reason is None else reason[:_REASON_CHARS]
            if status != "accepted" and session.ended:
                self._emit(session)

    def handed(self, pairs: Iterable[tuple[EpisodeSession | None, int | None]], version: int) -> None:
        """A batch went to the trainer at ``version``: each session with its staleness."""
        batch = []
        for session, staleness in pairs:
            if session is None:
                continue
            session.handed_version = version
            session.staleness = staleness
            batch.append(session)
        if batch:
            with self._lock:
                self._handed.append(batch)

    # ------------------------------------------------------------------ the trainer's side (any thread)

    def trained(self, step: int) -> None:
        """The oldest batch handed out was trained at ``step``: write its lines, then flush."""
        with self._lock:
            if self._handed:
                for session in self._handed.popleft():
                    session.trained_step = step
                    self._emit(session)
            self._flush()

    def flush(self) -> None:
        """Write the buffered lines."""
        with self._lock:
            self._flush()

    def close(self, reason: str = "the rollout executor stopped") -> None:
        """Every episode not written yet is ``dropped`` (``reason``); flush and close the file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            now = time.time()
            handed = {id(s) for batch in self._handed for s in batch}
            for session in list(self._open.values()):
                if session.end_t is None:
                    session.end_t = now
                if id(session) in handed:
                    why = "handed to the trainer, not marked trained before the executor stopped"
                elif session.status == "accepted":
                    why = f"accepted, not taken by the trainer: {reason}"
                else:
                    why = reason
                session.status, session.reason = "dropped", why
                self._emit(session)
            self._handed.clear()
            try:
                self._flush()
            finally:
                self._closed = True
                if self._handle is not None:
                    self._handle.close()
                    self._handle = None

    # ------------------------------------------------------------------ writing (under the lock)

    def _emit(self, session: EpisodeSession) -> None:
        if self._open.pop(id(session), None) is None:
            return  # written already
        self._lines.append(json.dumps(session.to_json(), separators=(",", ":")))
        if len(self._lines) >= _FLUSH_LINES:
            self._flush()

    def _flush(self) -> None:
        if not self._lines or self.path is None or self._closed:
            return
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _cut_partial_tail(self.path)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across flushes
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        self._handle.write(text)
        self._handle.flush()
        self.written += text.count("\n")


def _cut_partial_tail(path: Path) -> None:
    """Cut a last line without its newline (a writer killed mid-write) so appends stay valid JSONL."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        block = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                handle.truncate(start + cut + 1)
                break
            end = start
        else:
            handle.truncate(0)
    logger.warning("%s ended in a partial line (a writer was killed mid-write); it was cut off", path)


def filter_reason(group_filter: Any, trajs: Iterable[Any]) -> str:
    """Why the group filter dropped a group (``trajs``: its trajectories, None for a missing one)."""
    rewards = {float(t.reward) for t in trajs if t is not None}
    if len(rewards) == 1:
        return f"group filter: all rewards equal ({next(iter(rewards)):g})"
    return f"group filter: {getattr(group_filter, '__name__', type(group_filter).__name__)} returned False"


# ---------------------------------------------------------------------------------------------- context


def current_session() -> EpisodeSession | None:
    """The session of the episode whose task is running (None outside a traced episode)."""
    return _CURRENT.get()


def bind(session: EpisodeSession | None) -> contextvars.Token[EpisodeSession | None]:
    """Make ``session`` the current one in this task (the executor does it as an episode starts)."""
    return _CURRENT.set(session)


def note_rejection(reason: str) -> None:
    """A workflow says why it returns None (``prompt too long``, ``empty output``); a no-op outside a
    traced episode."""
    session = _CURRENT.get()
    if session is not None:
        session.note = reason


def timed_reward(fn: Callable[..., Awaitable[float]]) -> Callable[..., Awaitable[float]]:
    """``fn`` (an async reward) that notes its start, end and value on the current episode's session
    (first start and last end over several calls, as a multi-turn episode makes)."""

    @functools.wraps(fn)
    async def scored(*args: Any, **kwargs: Any) -> float:
        session = _CURRENT.get()
        if session is None:
            return await fn(*args, **kwargs)
        started = time.time()
        try:
            value = await fn(*args, **kwargs)
        finally:
            if session.reward_t0 is None:
                session.reward_t0 = started
            session.reward_t1 = time.time()
        session.reward = float(value)
        return value

    return scored
