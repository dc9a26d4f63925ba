"""Which nodes share the probed location: the pure part of the multi-node check.

A path that is not shared fails every node's read symmetrically (node 0 misses node 1's probe and
node 1 misses node 0's), which names nobody. The odd nodes are found against a reference view:

* the coordinator's, when it sees at least one probe after the write round (it lists the probe
  directory): the nodes whose probe it sees share the location with it, the others do not;
* else node 0's (the coordinator may be a login node that does not mount the path, or each node was
  given its own path): node 0 and the nodes whose probe it found (intact or not) share it, the
  nodes whose probe it could not find do not.

:func:`sharing_group` returns that reference group; a node outside it is named as the one that
"does not share <path> with node <r>", and a node inside it only fails for probes of the group it
could not read (or read corrupt).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SharingGroup", "nodes_in_listing", "sharing_group"]

_PROBE_NAME = re.compile(r"(?:^|/)node-(\d+)\.json$")


def nodes_in_listing(names: Iterable[str]) -> set[int]:
    """The node indices of the probe files (``node-<i>.json``) among ``names``."""
    found = set()
    for name in names:
        match = _PROBE_NAME.search(name)
        if match:
            found.add(int(match.group(1)))
    return found


@dataclass(frozen=True)
class SharingGroup:
    """The nodes that share the location with the reference (``members``); ``by_coordinator``: the
    reference is the coordinator's listing, else node ``reference``'s read."""

    members: frozenset[int]
    reference: int
    by_coordinator: bool


def sharing_group(
    nodes: int, coordinator_sees: set[int] | None, reads: Mapping[int, dict[str, Any] | None]
) -> SharingGroup | None:
    """The reference group (see the module docstring), or None when there is no reference view
    (the coordinator sees no probe and node 0 reported no read result)."""
    seen = {n for n in (coordinator_sees or set()) if 0 <= n < nodes}
    if seen:
        return SharingGroup(frozenset(seen), min(seen), True)
    first = reads.get(0)
    if first is None or not isinstance(first.get("missing"), list):
        return None  # node 0 did not get as far as looking for the other probes
    missing = {int(n) for n in first["missing"]}
    return SharingGroup(frozenset(n for n in range(nodes) if n not in missing), 0, False)
