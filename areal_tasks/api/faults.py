"""Deterministic fault points for the fault tests: a named place in the code where a test can have a
real process die (or freeze) at an exact moment.

``fault_point(name, **ctx)`` costs one environment look-up and does nothing unless ``AREAL_FAULTS``
is set. Its value is one or more specs separated by ``;``::

    AREAL_FAULTS="rl.step.before_update:rank=1:step=4:action=sigkill:once=/tmp/t/fired"

A spec fires at point ``name`` when every other ``key=value`` equals the call's context (``rank``
defaults to the ``RANK`` environment variable that torch distributed workers get). Keys:

``action``
    ``sigkill`` (default): log the firing, then SIGKILL this process -- a real kill at an exact
    point, nothing cleans up. ``pause``: log, create ``<once>.reached`` (or the ``reached=`` path),
    then wait until ``<once>.release`` (or the ``release=`` path) exists -- forever without one: the
    test kills the process, or lets it go on once it has arranged what it needs meanwhile.
``once``
    a path created with ``O_EXCL`` before firing: the spec fires at most once across processes and
    attempts (a retried job does not die again at the same point).

Every firing logs ``fault <name> fired on rank <rank> (<ctx>)`` at ERROR first, so the failed
worker's log tail names it. Torch-free; the environment reaches workers because the scheduler and
the job runner pass it on.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field

__all__ = ["FAULTS_ENV", "FaultSpec", "fault_point", "parse_faults"]

logger = logging.getLogger(__name__)

#: environment variable holding the fault specs (unset: every fault point is a no-op).
FAULTS_ENV = "AREAL_FAULTS"
_ACTIONS = ("sigkill", "pause")
_PAUSE_S = 3600.0
_POLL_S = 0.05


@dataclass(frozen=True)
class FaultSpec:
    """One parsed spec: where it fires, on which context, and what it does."""

    point: str
    match: dict[str, str] = field(default_factory=dict)
    action: str = "sigkill"
    once: str | None = None
    reached: str | None = None
    release: str | None = None

    def matches(self, point: str, ctx: dict[str, str]) -> bool:
        return point == self.point and all(ctx.get(key) == value for key, value in self.match.items())


def parse_faults(text: str) -> list[FaultSpec]:
    """The specs of an ``AREAL_FAULTS`` value; ValueError naming the bad part."""
    specs = []
    for raw in (part.strip() for part in text.split(";")):
        if not raw:
            continue
        point, *pairs = raw.split(":")
        options: dict[str, str] = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise ValueError(f"{FAULTS_ENV}: {pair!r} in {raw!r} is not key=value")
            options[key] = value
        action = options.pop("action", "sigkill")
        if action not in _ACTIONS:
            raise ValueError(f"{FAULTS_ENV}: action {action!r} in {raw!r}; use one of {', '.join(_ACTIONS)}")
        once, reached, release = options.pop("once", None), options.pop("reached", None), options.pop("release", None)
        specs.append(FaultSpec(point, options, action, once, reached, release))
    return specs


def fault_point(name: str, **ctx: object) -> None:
    """Fire the first spec of ``AREAL_FAULTS`` matching ``name`` and ``ctx`` (a no-op when unset)."""
    text = os.environ.get(FAULTS_ENV)
    if not text:
        return
    context = {key: str(value) for key, value in ctx.items()}
    context.setdefault("rank", os.environ.get("RANK", "0"))
    for spec in parse_faults(text):
        if spec.matches(name, context) and _claim(spec):
            _fire(spec, name, context)
            return


def _claim(spec: FaultSpec) -> bool:
    """Whether this process may fire ``spec`` (its ``once`` file did not exist: now it does)."""
    if spec.once is None:
        return True
    try:
        fd = os.open(spec.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    return True


def _fire(spec: FaultSpec, name: str, ctx: dict[str, str]) -> None:
    detail = ", ".join(f"{k}={v}" for k, v in sorted(ctx.items()) if k != "rank")
    logger.error("fault %s fired on rank %s (%s): %s", name, ctx["rank"], detail, spec.action)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    sys.stdout.flush()
    if spec.action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(_PAUSE_S)  # not reached: SIGKILL cannot be caught
    reached = spec.reached or (f"{spec.once}.reached" if spec.once else None)
    release = spec.release or (f"{spec.once}.release" if spec.once else None)
    if reached is not None:
        with open(reached, "w") as handle:
            handle.write(f"{os.getpid()}\n")
    while release is None or not os.path.exists(release):
        time.sleep(_POLL_S if release is not None else _PAUSE_S)
    logger.warning("fault %s on rank %s released", name, ctx["rank"])
