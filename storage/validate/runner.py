"""How the multi-node probe reaches the nodes: a small protocol the caller implements.

``storage`` starts no processes of its own on nodes. The caller hands :func:`validate_storage` a
:class:`ProbeRunner` that runs one command once per node, concurrently, with ``{rank}`` in the
command replaced by the node's index: ``areal storage validate`` and ``areal train`` pass one
backed by the project's Scheduler (``areal_tasks.launch.probe_runner``: one worker per node of the
scheduler; with the LocalScheduler, separate processes play the nodes); tests may pass
:class:`storage.testing.runner.LocalProcessRunner`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["RANK_PLACEHOLDER", "NodeOutcome", "ProbeRunner"]

#: replaced by the node index (0..nodes-1) in every command item.
RANK_PLACEHOLDER = "{rank}"


@dataclass(frozen=True)
class NodeOutcome:
    """One node's run of a command: its exit code (None if it had not finished in time) and output.

    ``host``: how the runner knows the node, e.g. ``arKn1, 10.231.7.11`` (its name and address);
    messages then name it ``node 1 (arKn1, 10.231.7.11)``. None: the host name the probe reports.
    """

    node: int
    exit_code: int | None
    output: str
    host: str | None = None


@runtime_checkable
class ProbeRunner(Protocol):
    """Runs a command once on each of ``nodes`` nodes at the same time."""

    def run_on_nodes(
        self, command: Sequence[str], nodes: int, env: Mapping[str, str], timeout_s: float
    ) -> list[NodeOutcome]:
        """Run ``command`` (``{rank}`` = node index) on every node with ``env`` added to the
        environment; wait up to ``timeout_s``; return one outcome per node, in node order.

        Nodes still running at the timeout are stopped and reported with ``exit_code=None``.
        """
        ...
