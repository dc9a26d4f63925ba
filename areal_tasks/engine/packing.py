"""Partitioning sequences into parts by token count: first-fit decreasing and Karmarkar-Karp.

Pure Python and torch-free: it sees only a list of sequence lengths and returns lists of indices.
:mod:`areal_tasks.engine.microbatch` turns the indices into packed micro-batches, and ``dp_split``
uses the same routine to share a batch between data-parallel ranks.

Units. Sequences are grouped into *units* of ``granularity`` consecutive sequences (a GRPO group
of ``group_size`` samples, say); a unit is never split between parts. The number of sequences must
be a whole number of units.

Methods.

- ``ffd`` (first-fit decreasing): units are taken largest first and each goes into the first part
  that still has room under ``max_tokens``; a new part opens when none has. It minimises the
  number of parts (micro-batches) under the cap; the last parts are often far from full. When
  more parts are required (``min_parts``) than FFD needs, the units are dealt largest first onto
  the least-loaded of ``min_parts`` parts instead (LPT scheduling), so a forced split is balanced.
- ``kk`` (Karmarkar-Karp, the multi-way largest differencing method): starting from
  ``k = max(min_parts, ceil(total / max_tokens))`` parts, the k-way partial partitions of the two
  units/partitions with the largest spread are merged, largest subset with smallest, until one
  partition remains. If its largest part breaks the cap, ``k`` grows by one and it runs again
  (with one unit per part every cap that admits each unit is met). Part sums come out close to
  equal, which is what matters for data-parallel ranks that wait for the slowest one.

Both are deterministic: ties are broken by unit index. Every part is non-empty; indices within a
part are ascending and parts are ordered by their first index.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Sequence

from areal_tasks.errors import ConfigError, EngineError

logger = logging.getLogger(__name__)

#: the partitioning methods :func:`partition` understands.
METHODS = ("ffd", "kk")


def partition(
    lengths: Sequence[int],
    *,
    max_tokens: int | None,
    min_parts: int = 1,
    method: str = "ffd",
    granularity: int = 1,
) -> list[list[int]]:
    """Split sequence indices ``0..len(lengths)-1`` into parts by token count.

    Args:
        lengths: tokens of each sequence (each >= 1).
        max_tokens: cap on the token sum of every part; ``None`` for no cap.
        min_parts: at least this many parts. With fewer units than that, every unit gets its own
            part (and a warning says so); the caller pads with dummy parts if it needs the count.
        method: ``"ffd"`` (fewest parts under the cap) or ``"kk"`` (balanced part sums).
        granularity: consecutive sequences that form one indivisible unit.

    Returns:
        The parts, each a list of sequence indices; every index appears in exactly one part.

    Raises:
        ConfigError: an argument is out of range or the method is unknown.
        EngineError: a length is not positive, the sequences are not a whole number of units, or
            one unit alone holds more than ``max_tokens`` tokens.
    """
    _check_args(max_tokens=max_tokens, min_parts=min_parts, method=method, granularity=granularity)
    units = _make_units(lengths, granularity)
    if not units:
        return []
    sizes = [sum(lengths[i] for i in unit) for unit in units]
    if max_tokens is not None:
        _check_cap(sizes, units, max_tokens)
    want = min_parts
    if want > len(units):
        logger.warning(
            "only %d unit(s) of %d sequence(s) each for %d requested parts: returning %d parts",
            len(units),
            granularity,
            min_parts,
            len(units),
        )
        want = len(units)
    if method == "ffd":
        bins = _first_fit_decreasing(sizes, max_tokens)
        if len(bins) < want:
            bins = _grow_until_fits(sizes, max_tokens, want, _lpt)
    else:
        start = want if max_tokens is None else max(want, -(-sum(sizes) // max_tokens))
        bins = _grow_until_fits(sizes, max_tokens, min(start, len(units)), _karmarkar_karp)
    parts = [sorted(i for u in unit_ids for i in units[u]) for unit_ids in bins]
    return sorted(parts, key=lambda part: part[0])


def part_sums(lengths: Sequence[int], parts: Sequence[Sequence[int]]) -> list[int]:
    """Token sum of every part (a convenience for callers, logs and benchmarks)."""
    return [sum(lengths[i] for i in part) for part in parts]


def _check_args(*, max_tokens: int | None, min_parts: int, method: str, granularity: int) -> None:
    if method not in METHODS:
        raise ConfigError(f"packing method must be one of {METHODS}, got {method!r}")
    if isinstance(min_parts, bool) or not isinstance(min_parts, int) or min_parts < 1:
        raise ConfigError(f"min_parts must be an integer >= 1, got {min_parts!r}")
    if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity < 1:
        raise ConfigError(f"granularity must be an integer >= 1, got {granularity!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ConfigError(f"max_tokens must be None or an integer >= 1, got {max_tokens!r}")


def _make_units(lengths: Sequence[int], granularity: int) -> list[list[int]]:
    bad = [(i, n) for i, n in enumerate(lengths) if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        i, n = bad[0]
        raise EngineError(f"sequence lengths must be integers >= 1; sequence {i} has length {n!r}")
    if len(lengths) % granularity:
        raise EngineError(
            f"{len(lengths)} sequences are not a whole number of units of granularity={granularity} "
            "(e.g. GRPO groups); make the batch size a multiple of the group size or set granularity=1"
        )
    return [list(range(start, start + granularity)) for start in range(0, len(lengths), granularity)]


def _check_cap(sizes: list[int], units: list[list[int]], max_tokens: int) -> None:
    worst = max(range(len(sizes)), key=lambda u: sizes[u])
    if sizes[worst] > max_tokens:
        first, last = units[worst][0], units[worst][-1]
        what = f"sequence {first}" if first == last else f"the unit of sequences {first}..{last}"
        raise EngineError(
            f"{what} holds {sizes[worst]} tokens, more than max_tokens={max_tokens}, and cannot be split; "
            "raise max_tokens_per_mb (or memory_budget_gb), lower granularity, or cap the generation length"
        )


def _order_decreasing(sizes: list[int]) -> list[int]:
    """Unit indices, largest first; equal sizes keep index order (the determinism guarantee)."""
    return sorted(range(len(sizes)), key=lambda u: (-sizes[u], u))


def _first_fit_decreasing(sizes: list[int], cap: int | None) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for u in _order_decreasing(sizes):
        for b, load in enumerate(loads):
            if cap is None or load + sizes[u] <= cap:
                bins[b].append(u)
                loads[b] += sizes[u]
                break
        else:
            bins.append([u])
            loads.append(sizes[u])
    return bins


def _lpt(sizes: list[int], k: int) -> list[list[int]]:
    """Largest unit first onto the least-loaded of ``k`` parts (ties: lowest part index)."""
    heap = [(0, b) for b in range(k)]
    bins: list[list[int]] = [[] for _ in range(k)]
    for u in _order_decreasing(sizes):
        load, b = heapq.heappop(heap)
        bins[b].append(u)
        heapq.heappush(heap, (load + sizes[u], b))
    return bins


def _karmarkar_karp(sizes: list[int], k: int) -> list[list[int]]:
    """Multi-way largest differencing: ``k`` parts with near-equal sums.

    Each heap entry is a k-way partial partition: its non-empty subsets ``[sum, units]`` sorted by
    sum, largest first (the missing ones are empty); the key is its spread (largest minus smallest
    sum). Merging pairs the largest subset of one with the smallest of the other.
    """
    heap = [(-sizes[u], order, [[sizes[u], [u]]]) for order, u in enumerate(_order_decreasing(sizes))]
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = _merge_partitions(first, second, k)
        smallest = merged[-1][0] if len(merged) == k else 0
        heapq.heappush(heap, (smallest - merged[0][0], counter, merged))
        counter += 1
    return [subset[1] for subset in heap[0][2]]


def _merge_partitions(first: list[list], second: list[list], k: int) -> list[list]:
    """Subset ``i`` of ``first`` joins subset ``k-1-i`` of ``second`` (both padded to ``k`` with
    empty subsets); only the indices where a non-empty subset exists are visited, so a merge costs
    O(len(first) + len(second)) rather than O(k)."""
    a, b = len(first), len(second)
    merged: list[list] = []
    for i in itertools.chain(range(a), range(max(a, k - b), k)):
        mine = first[i] if i < a else None
        theirs = second[k - 1 - i] if k - 1 - i < b else None
        if mine is None:
            merged.append(theirs)
        elif theirs is None:
            merged.append(mine)
        else:
            mine[0] += theirs[0]
            mine[1].extend(theirs[1])
            merged.append(mine)
    merged.sort(key=lambda subset: -subset[0])
    return merged


def _grow_until_fits(
    sizes: list[int], cap: int | None, k: int, method: Callable[[list[int], int], list[list[int]]]
) -> list[list[int]]:
    """Run ``method(sizes, k)`` for ``k, k+1, ...`` until every part fits the cap.

    Terminates: with one unit per part (``k == len(sizes)``) every part fits, since no unit
    exceeds the cap (checked before).
    """
    for parts in range(k, len(sizes) + 1):
        bins = method(sizes, parts)
        if cap is None or max(sum(sizes[u] for u in b) for b in bins) <= cap:
            return bins
    raise AssertionError("unreachable: one unit per part always fits the cap")
