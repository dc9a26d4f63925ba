"""The multi-node probe worker: ``python -m storage.validate.probe PHASE --run-id R --node I --nodes N --url U``.

Phases, each run on every node at once by the caller's runner:

* ``write``: the node writes ``.areal-probe/<run-id>/node-<I>.json`` (random token plus its hash).
* ``read``: the node reads every other node's probe and checks its hash; exit 1 if any is missing,
  corrupt or unreadable.
* ``clean``: the node deletes its own probe.

``--url`` may be given once (every node uses it) or once per node (node I uses the I-th: the same
shared location as each node mounts it). Storage options come as JSON in ``AREAL_STORAGE_OPTIONS``
(an environment variable, so secrets never show in a process listing). Each run prints one line
``AREAL_STORAGE_PROBE {json}`` that the coordinator parses.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import secrets
import socket
import sys
from collections.abc import Sequence
from typing import Any

from storage.errors import StorageError, StorageNotFoundError
from storage.storage import Storage

__all__ = ["OPTIONS_ENV", "PROBE_DIR", "RESULT_PREFIX", "main", "probe_key"]

OPTIONS_ENV = "AREAL_STORAGE_OPTIONS"
PROBE_DIR = ".areal-probe"
RESULT_PREFIX = "AREAL_STORAGE_PROBE "


def probe_key(run_id: str, node: int) -> str:
    """The key (below the storage root) of ``node``'s probe file for ``run_id``."""
    return f"{PROBE_DIR}/{run_id}/node-{node}.json"


def _write(storage: Storage, run_id: str, node: int) -> dict[str, Any]:
    token = secrets.token_hex(32)
    body = {"run_id": run_id, "node": node, "host": socket.gethostname(), "token": token}
    body["sha256"] = hashlib.sha256(token.encode()).hexdigest()
    storage.write_text(probe_key(run_id, node), json.dumps(body))
    return {"ok": True, "path": storage.url_for(probe_key(run_id, node))}


def _read(storage: Storage, run_id: str, node: int, nodes: int) -> dict[str, Any]:
    seen, missing, corrupt, errors = [], [], [], {}
    for other in range(nodes):
        if other == node:
            continue
        try:
            body = json.loads(storage.read_text(probe_key(run_id, other)))
        except StorageNotFoundError:
            missing.append(other)
            continue
        except (StorageError, ValueError) as exc:
            errors[str(other)] = f"{type(exc).__name__}: {exc}"
            continue
        intact = (
            isinstance(body, dict)
            and body.get("run_id") == run_id
            and body.get("node") == other
            and hashlib.sha256(str(body.get("token")).encode()).hexdigest() == body.get("sha256")
        )
        (seen if intact else corrupt).append(other)
    ok = not (missing or corrupt or errors)
    return {
        "ok": ok,
        "seen": seen,
        "missing": missing,
        "corrupt": corrupt,
        "errors": errors,
        "path": storage.url_for(f"{PROBE_DIR}/{run_id}"),
    }


def _clean(storage: Storage, run_id: str, node: int) -> dict[str, Any]:
    storage.delete(probe_key(run_id, node), missing_ok=True)
    if storage.is_local:
        # on a path private to this node nobody else removes the probe directories; rmdir only
        # removes them once empty, so other nodes' (or other runs') probes are never touched
        for directory in (f"{PROBE_DIR}/{run_id}", PROBE_DIR):
            try:
                os.rmdir(storage.fs_path(directory))
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
                break  # still in use, or another node removed it first
    return {"ok": True}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storage.validate.probe", description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("write", "read", "clean"))
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--url", action="append", required=True, help="once, or once per node")
    args = parser.parse_args(argv)
    if len(args.url) not in (1, args.nodes) or not 0 <= args.node < args.nodes:
        parser.error(f"--url must be given once or {args.nodes} times, and 0 <= --node < --nodes")
    url = args.url[0] if len(args.url) == 1 else args.url[args.node]
    result: dict[str, Any] = {"phase": args.phase, "node": args.node, "host": socket.gethostname(), "pid": os.getpid()}
    try:
        options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
        storage = Storage.from_url(url, options)
        if args.phase == "write":
            result.update(_write(storage, args.run_id, args.node))
        elif args.phase == "read":
            result.update(_read(storage, args.run_id, args.node, args.nodes))
        else:
            result.update(_clean(storage, args.run_id, args.node))
    except (StorageError, OSError, ValueError) as exc:  # process boundary: report the failure to the coordinator
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
