"""The pure naming logic of the multi-node check: which nodes share the location (the reference
group), from the coordinator's listing or, when it sees no probe, from node 0's read."""

from __future__ import annotations

from storage.validate.visibility import SharingGroup, nodes_in_listing, sharing_group


def _read(missing: list[int], seen: list[int] | None = None) -> dict[str, object]:
    return {"ok": not missing, "seen": seen or [], "missing": missing, "corrupt": [], "errors": {}}


def test_probe_names_become_node_indices() -> None:
    names = {"node-0.json": 10, "sub/node-12.json": 3, "node-x.json": 1, "other.txt": 2, "node-3.json.tmp": 1}
    assert nodes_in_listing(names) == {0, 12}


def test_the_coordinators_listing_is_the_reference_when_it_sees_a_probe() -> None:
    reads = {0: _read([1]), 1: _read([0])}
    assert sharing_group(2, {1}, reads) == SharingGroup(frozenset({1}), 1, True)
    assert sharing_group(3, {0, 2, 7}, reads) == SharingGroup(frozenset({0, 2}), 0, True)  # 7: not a node


def test_node_0s_read_is_the_reference_when_the_coordinator_sees_nothing() -> None:
    symmetric = {0: _read([1], []), 1: _read([0], [])}
    for listing in (set(), None):
        assert sharing_group(2, listing, symmetric) == SharingGroup(frozenset({0}), 0, False)
    # three nodes, node 2 odd: node 0 misses only node 2's probe
    reads = {0: _read([2], [1]), 1: _read([2], [0]), 2: _read([0, 1])}
    assert sharing_group(3, None, reads) == SharingGroup(frozenset({0, 1}), 0, False)


def test_no_reference_without_a_listing_or_node_0s_read() -> None:
    assert sharing_group(2, set(), {0: None, 1: _read([0])}) is None
    assert sharing_group(2, None, {0: {"ok": False, "error": "OSError: boom"}}) is None
