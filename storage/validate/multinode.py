"""The multi-node check: a probe written by each node must be readable by every other node.

Rounds run through the caller's :class:`~storage.validate.runner.ProbeRunner` (write, read, and
clean unless the coordinator can remove every probe itself; see :mod:`storage.validate.probe`).
``multinode.write`` fails naming each node that could not write (a path it cannot create, an S3
endpoint it cannot reach). Between the write and the read rounds the coordinator lists the probe
directory; ``multinode.visibility`` then gets one result per node, and a location that is not
shared fails the odd node(s) only: "node 1 (n1, 10.0.0.11) does not share <path> with node 0
(n0, 10.0.0.10)" (see :mod:`storage.validate.visibility` for how the reference view is chosen).
Nodes are named by the runner's ``NodeOutcome.host`` when it gives one.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from storage.errors import StorageError, StorageNotFoundError
from storage.validate.context import CheckContext
from storage.validate.probe import OPTIONS_ENV, PROBE_DIR, RESULT_PREFIX
from storage.validate.report import CheckResult, Status
from storage.validate.runner import RANK_PLACEHOLDER, NodeOutcome, ProbeRunner
from storage.validate.visibility import nodes_in_listing, sharing_group

__all__ = ["run_multinode_checks"]

logger = logging.getLogger(__name__)

_NOT_SHARED_FIX = (
    "the nodes do not see the same files: use a filesystem mounted at the same path on every node (NFS, Lustre, "
    "GPFS, CephFS...) or s3://; if each node mounts it elsewhere, pass each node's path (--node-paths)"
)
_TAIL_CHARS = 600


def _parse(outcome: NodeOutcome) -> dict[str, Any] | None:
    for line in reversed(outcome.output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                parsed = json.loads(line[len(RESULT_PREFIX) :])
            except json.JSONDecodeError:
                return None
            return parsed if isinstance(parsed, dict) else None
    return None


def _label(outcome: NodeOutcome, parsed: dict[str, Any] | None) -> str:
    host = outcome.host or (parsed or {}).get("host")
    return f"node {outcome.node} ({host})" if host else f"node {outcome.node}"


def _no_result(outcome: NodeOutcome, timeout_s: float) -> str:
    if outcome.exit_code is None:
        return f"did not finish within {timeout_s:g} s"
    tail = outcome.output[-_TAIL_CHARS:].strip() or "(no output)"
    return f"exited with code {outcome.exit_code} without a result; output tail: {tail}"


def _command(python: str, phase: str, run_id: str, nodes: int, urls: Sequence[str]) -> list[str]:
    command = [python, "-m", "storage.validate.probe", phase, "--run-id", run_id, "--node", RANK_PLACEHOLDER]
    command += ["--nodes", str(nodes)]
    for url in urls:
        command += ["--url", url]
    return command


def _describe_read_failure(node: int, parsed: dict[str, Any], group: frozenset[int] | None) -> str:
    parts = []
    missing = [n for n in parsed.get("missing") or [] if group is None or n in group]
    if missing:
        writers = ", ".join(f"node {n}" for n in missing)
        parts.append(f"could not find the probe(s) written by {writers} under {parsed.get('path')}")
    if parsed.get("corrupt"):
        parts.append(f"read corrupt probe(s) from node(s) {parsed['corrupt']}")
    for other, error in (parsed.get("errors") or {}).items():
        parts.append(f"failed reading node {other}'s probe: {error}")
    if parsed.get("error"):
        parts.append(str(parsed["error"]))
    return f"node {node} " + "; ".join(parts or ["failed"])


def _read_failed(parsed: dict[str, Any], group: frozenset[int] | None) -> bool:
    """Whether a node of the sharing group (or any node, without one) failed its read: a missing
    probe of a node outside the group is that node's fault, not this one's."""
    if parsed.get("ok"):
        return False
    missing = [n for n in parsed.get("missing") or [] if group is None or n in group]
    return bool(missing or parsed.get("corrupt") or parsed.get("errors") or parsed.get("error"))


def run_multinode_checks(
    ctx: CheckContext,
    runner: ProbeRunner,
    urls: Sequence[str],
    options: Mapping[str, Any],
    *,
    timeout_s: float = 60.0,
    python: str = sys.executable,
) -> None:
    """Run the probe on ``ctx.nodes`` nodes (``urls``: one for all, or one per node) and record results."""
    nodes, run_id = ctx.nodes, uuid.uuid4().hex[:12]
    env = {OPTIONS_ENV: json.dumps(dict(options))}
    path_of = (lambda i: urls[0]) if len(urls) == 1 else (lambda i: urls[i])
    add = ctx.report.results.append

    writes = runner.run_on_nodes(_command(python, "write", run_id, nodes, urls), nodes, env, timeout_s)
    write_failures = []
    for outcome in writes:
        parsed = _parse(outcome)
        if parsed is None or not parsed.get("ok"):
            why = _no_result(outcome, timeout_s) if parsed is None else parsed.get("error", "failed")
            write_failures.append(outcome.node)
            add(
                CheckResult(
                    "multinode.write",
                    Status.FAIL,
                    _label(outcome, parsed),
                    path_of(outcome.node),
                    f"{_label(outcome, parsed)} could not write its probe: {why}",
                    "make the location writable and reachable from every node (same user and permissions, "
                    "mounted read-write; for s3://, the endpoint reachable from the node)",
                )
            )
    all_read = False
    if write_failures:
        ctx.skip("multinode.visibility", f"not run: node(s) {write_failures} could not write their probes")
    else:
        add(
            CheckResult(
                "multinode.write", Status.PASS, f"all {nodes} nodes", urls[0], f"each of {nodes} nodes wrote a probe"
            )
        )
        coordinator_sees = _coordinator_sees(ctx, run_id)
        reads = runner.run_on_nodes(_command(python, "read", run_id, nodes, urls), nodes, env, timeout_s)
        _record_visibility(ctx, reads, coordinator_sees, path_of, timeout_s)
        all_read = all(r.status is Status.PASS for r in ctx.report.results if r.check == "multinode.visibility")
    _clean(ctx, runner, _command(python, "clean", run_id, nodes, urls), env, timeout_s, run_id, all_read)


def _record_visibility(
    ctx: CheckContext,
    reads: Sequence[NodeOutcome],
    coordinator_sees: set[int] | None,
    path_of: Callable[[int], str],
    timeout_s: float,
) -> None:
    """One ``multinode.visibility`` result per node; a node outside the sharing group is named as
    the one that does not share the location (see :mod:`storage.validate.visibility`)."""
    parsed_of = {outcome.node: _parse(outcome) for outcome in reads}
    labels = {outcome.node: _label(outcome, parsed_of[outcome.node]) for outcome in reads}
    group = sharing_group(ctx.nodes, coordinator_sees, parsed_of)
    add = ctx.report.results.append
    for outcome in reads:
        parsed, label, where = parsed_of[outcome.node], labels[outcome.node], path_of(outcome.node)
        if parsed is None:
            message, status = f"node {outcome.node} {_no_result(outcome, timeout_s)}", Status.FAIL
        elif group is not None and outcome.node not in group.members:
            reference = labels.get(group.reference, f"node {group.reference}")
            also = f" and the coordinator ({ctx.node})" if group.by_coordinator else ""
            message, status = f"{label} does not share {where} with {reference}{also}", Status.FAIL
        elif _read_failed(parsed, None if group is None else group.members):
            message = _describe_read_failure(outcome.node, parsed, None if group is None else group.members)
            status = Status.FAIL
        else:
            message, status = f"node {outcome.node} read the probes of nodes {parsed.get('seen')}", Status.PASS
            if parsed.get("missing"):  # only probes of nodes outside the sharing group: their failure
                message += f" (not those of the odd node(s) {parsed['missing']})"
        fix = _NOT_SHARED_FIX if status is Status.FAIL else None
        add(CheckResult("multinode.visibility", status, label, where, message, fix, details=parsed or {}))


def _coordinator_sees(ctx: CheckContext, run_id: str) -> set[int] | None:
    """The nodes whose probe the coordinator finds in its own view of the location (None: it cannot list)."""
    try:
        return nodes_in_listing(ctx.storage.walk_files(f"{PROBE_DIR}/{run_id}"))
    except StorageNotFoundError:
        return set()
    except StorageError as exc:
        logger.info("the coordinator cannot list the probes (%s); node 0's view is the reference", exc)
        return None


def _coordinator_sees_all(ctx: CheckContext, run_id: str) -> bool:
    try:
        return len(ctx.storage.walk_files(f"{PROBE_DIR}/{run_id}")) == ctx.nodes
    except StorageError as exc:
        logger.debug("coordinator cannot list the probes (%s); every node removes its own", exc)
        return False


def _clean(
    ctx: CheckContext,
    runner: ProbeRunner,
    command: list[str],
    env: Mapping[str, str],
    timeout_s: float,
    run_id: str,
    all_read: bool,
) -> None:
    """Remove the probes: the coordinator alone when it sees all of them (one shared location), else
    every node its own (private paths keep no leftovers) and then the coordinator its view."""
    problems = []
    if not (all_read and _coordinator_sees_all(ctx, run_id)):
        for outcome in runner.run_on_nodes(command, ctx.nodes, env, timeout_s):
            parsed = _parse(outcome)
            if parsed is None or not parsed.get("ok"):
                problems.append(
                    f"node {outcome.node}: {_no_result(outcome, timeout_s) if parsed is None else parsed.get('error')}"
                )
    try:
        ctx.storage.delete(f"{PROBE_DIR}/{run_id}", recursive=True, missing_ok=True)
        if ctx.storage.exists(PROBE_DIR) and not ctx.storage.list(PROBE_DIR):
            ctx.storage.delete(PROBE_DIR, recursive=True, missing_ok=True)
    except StorageError as exc:
        problems.append(f"coordinator: {exc}")
    if problems:
        ctx.report.results.append(
            CheckResult(
                "multinode.cleanup",
                Status.WARN,
                ctx.node,
                ctx.storage.url_for(PROBE_DIR),
                "probe files may be left behind: " + "; ".join(problems),
                f"delete {PROBE_DIR}/{run_id} by hand",
            )
        )
