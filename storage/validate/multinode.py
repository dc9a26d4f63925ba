"""The multi-node check: a probe written by each node must be readable by every other node.

Rounds run through the caller's :class:`~storage.validate.runner.ProbeRunner` (write, read, and
clean unless the coordinator can remove every probe itself; see :mod:`storage.validate.probe`).
``multinode.write`` fails naming each node that could not write; ``multinode.visibility`` gets one
result per node, failing for each node that could not read another node's probe, which is what a
path that is not shared between the nodes looks like.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from storage.errors import StorageError
from storage.validate.context import CheckContext
from storage.validate.probe import OPTIONS_ENV, PROBE_DIR, RESULT_PREFIX
from storage.validate.report import CheckResult, Status
from storage.validate.runner import RANK_PLACEHOLDER, NodeOutcome, ProbeRunner

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


def _label(node: int, parsed: dict[str, Any] | None) -> str:
    host = (parsed or {}).get("host")
    return f"node {node} ({host})" if host else f"node {node}"


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


def _describe_read_failure(node: int, parsed: dict[str, Any]) -> str:
    parts = []
    if parsed.get("missing"):
        writers = ", ".join(f"node {n}" for n in parsed["missing"])
        parts.append(f"could not find the probe(s) written by {writers} under {parsed.get('path')}")
    if parsed.get("corrupt"):
        parts.append(f"read corrupt probe(s) from node(s) {parsed['corrupt']}")
    for other, error in (parsed.get("errors") or {}).items():
        parts.append(f"failed reading node {other}'s probe: {error}")
    if parsed.get("error"):
        parts.append(str(parsed["error"]))
    return f"node {node} " + "; ".join(parts or ["failed"])


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
                    _label(outcome.node, parsed),
                    path_of(outcome.node),
                    f"could not write its probe: {why}",
                    "make the path writable from every node (same user/permissions, mounted read-write)",
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
        for outcome in runner.run_on_nodes(_command(python, "read", run_id, nodes, urls), nodes, env, timeout_s):
            parsed = _parse(outcome)
            label, where = _label(outcome.node, parsed), path_of(outcome.node)
            if parsed is None:
                add(
                    CheckResult(
                        "multinode.visibility",
                        Status.FAIL,
                        label,
                        where,
                        f"node {outcome.node} {_no_result(outcome, timeout_s)}",
                        _NOT_SHARED_FIX,
                    )
                )
            elif parsed.get("ok"):
                add(
                    CheckResult(
                        "multinode.visibility",
                        Status.PASS,
                        label,
                        where,
                        f"node {outcome.node} read the probes of nodes {parsed.get('seen')}",
                        details=parsed,
                    )
                )
            else:
                add(
                    CheckResult(
                        "multinode.visibility",
                        Status.FAIL,
                        label,
                        where,
                        _describe_read_failure(outcome.node, parsed),
                        _NOT_SHARED_FIX,
                        details=parsed,
                    )
                )
        all_read = all(r.status is Status.PASS for r in ctx.report.results if r.check == "multinode.visibility")
    _clean(ctx, runner, _command(python, "clean", run_id, nodes, urls), env, timeout_s, run_id, all_read)


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
