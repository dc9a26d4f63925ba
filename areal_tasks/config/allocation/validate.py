"""Semantics: check a raw parse against the allocation rules and build the AllocationMode.

Per component: known backend, known dims, each dim once and >= 1, only the dims the backend
accepts, the hybrid attn/ffn rules, and for plain MoE training ``e | d*c``. Across components:
naming (colocated or three-plus components must be named, names unique), equal world sizes
inside a colocated group, and the total fitting the cluster. Every failure points at the
offending character.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NoReturn

from areal_tasks.config.allocation.backends import (
    ALL_BACKENDS,
    ALLOWED_DIMS,
    DIM_NAMES,
    DIMS_HINT,
    HYBRID_BACKENDS,
    HYBRID_PART_DIMS,
    backend_hint,
    closest,
    kind_of,
    refusal,
)
from areal_tasks.config.allocation.model import AllocationMode, Component, HybridDims, ParallelDims
from areal_tasks.config.allocation.parser import RawComponent, RawDim, RawPart, RawSpec
from areal_tasks.errors import AllocationError

#: (message, hint) for a dim the context does not accept, given its letter.
Refusal = Callable[[str], tuple[str, str]]

_PART_REFUSALS: dict[tuple[str, str], tuple[str, str]] = {
    ("attn", "e"): ("the attn part takes no expert dim (e)", "expert parallelism belongs to the ffn part"),
    ("ffn", "c"): (
        "the ffn part takes no context dim (c)",
        "context parallelism belongs to the attn part; the ffn part spans d*t*p*e GPUs",
    ),
}


def build_allocation(spec: str, raw: RawSpec, total_gpus: int | None = None) -> AllocationMode:
    """Validate ``raw`` (parsed from ``spec``) and return the AllocationMode it describes."""
    _check_cluster_size(total_gpus)
    pools = [[_component(spec, rc) for rc in pool] for pool in raw]
    _check_names(spec, raw)
    _check_colocated_worlds(spec, raw, pools)
    total = sum(pool[0].world_size for pool in pools)
    if total_gpus is not None and total > total_gpus:
        breakdown = " + ".join(
            f"{'|'.join(rc.text for rc in pool)} = {comps[0].world_size}" for pool, comps in zip(raw, pools)
        )
        raise AllocationError(
            f"invalid allocation spec: {spec!r} needs {total} GPUs but the cluster has {total_gpus}",
            hint=f"GPUs per pool: {breakdown}; shrink a pool or colocate components with '|'",
        )
    components: list[Component] = []
    for pool in pools:
        for comp in pool:
            others = tuple(o.name for o in pool if o is not comp and o.name is not None)
            components.append(dataclasses.replace(comp, colocated_with=others))
    return AllocationMode(spec=spec, components=tuple(components), total_gpus=total)


def _fail(spec: str, pos: int, problem: str, hint: str) -> NoReturn:
    raise AllocationError(f"invalid allocation spec: {problem} at position {pos}", spec=spec, position=pos, hint=hint)


def _check_cluster_size(total_gpus: int | None) -> None:
    if total_gpus is None:
        return
    if isinstance(total_gpus, bool) or not isinstance(total_gpus, int) or total_gpus < 1:
        raise AllocationError(
            f"the cluster size total_gpus must be a positive integer, got {total_gpus!r}",
            hint="pass the number of GPUs available, e.g. --gpus 8, or leave it out to skip the fit check",
        )


def _component(spec: str, rc: RawComponent) -> Component:
    if rc.backend not in ALL_BACKENDS:
        _fail(spec, rc.pos, f"unknown backend '{rc.backend}'", _unknown_backend_hint(rc.backend))
    kind = kind_of(rc.backend)
    if rc.parts is not None:
        hybrid = _hybrid(spec, rc)
        return Component(rc.backend, kind, rc.name, hybrid.attn, hybrid.attn.world_size, hybrid=hybrid)
    dims = _dims(spec, rc.text, rc.dims, ALLOWED_DIMS[rc.backend], lambda letter: refusal(rc.backend, letter))
    if dims.e > 1 and (dims.d * dims.c) % dims.e:
        e_pos = next(rd.pos for rd in rc.dims if rd.letter == "e")
        divisors = [n for n in range(1, dims.d * dims.c + 1) if (dims.d * dims.c) % n == 0]
        _fail(
            spec,
            e_pos,
            f"expert parallelism e{dims.e} does not divide d*c = {dims.d * dims.c} in '{rc.text}'",
            f"experts are sharded over the data x context ranks; choose e from {divisors}, "
            "or use the hybrid form to give the FFN layers their own layout",
        )
    return Component(rc.backend, kind, rc.name, dims, dims.world_size)


def _unknown_backend_hint(word: str) -> str:
    for backend in ALL_BACKENDS:
        if word.startswith(backend) and word[len(backend) : len(backend) + 1] in ("-", "_"):
            return f"names go in brackets: '{backend}[{word[len(backend) + 1 :]}]:DIMS'"
    return backend_hint(word)


def _dims(spec: str, text: str, raw_dims: tuple[RawDim, ...], allowed: str, refuse: Refusal) -> ParallelDims:
    seen: dict[str, RawDim] = {}
    for rd in raw_dims:
        if rd.letter not in DIM_NAMES:
            _fail(spec, rd.pos, f"unknown dim '{rd.text}' in '{text}'", DIMS_HINT)
        if rd.letter in seen:
            _fail(
                spec,
                rd.pos,
                f"dim '{rd.letter}' given twice ('{seen[rd.letter].text}' and '{rd.text}') in '{text}'",
                "write each dim once; omitted dims are 1",
            )
        if rd.size == 0:
            _fail(spec, rd.pos, f"dim '{rd.text}' is zero in '{text}'", "sizes are at least 1; omitted dims are 1")
        if rd.letter not in allowed:
            problem, hint = refuse(rd.letter)
            _fail(spec, rd.pos, f"{problem} ('{rd.text}' in '{text}')", hint)
        seen[rd.letter] = rd
    return ParallelDims(**{letter: rd.size for letter, rd in seen.items()})


def _hybrid(spec: str, rc: RawComponent) -> HybridDims:
    if rc.backend not in HYBRID_BACKENDS:
        _fail(
            spec,
            rc.pos,
            f"the MoE hybrid form needs {' or '.join(HYBRID_BACKENDS)}, not {rc.backend}",
            f"write e.g. megatron:(attn:d4p2|ffn:d2p2e2), or give {rc.backend} plain dims",
        )
    parts: dict[str, RawPart] = {}
    for part in rc.parts or ():
        if part.label not in HYBRID_PART_DIMS:
            guess = closest(part.label, list(HYBRID_PART_DIMS))
            lead = f"did you mean '{guess}'? " if guess else ""
            _fail(spec, part.pos, f"unknown hybrid part '{part.label}'", f"{lead}the two parts are attn and ffn")
        if part.label in parts:
            _fail(spec, part.pos, f"hybrid part '{part.label}' given twice", "write one attn part and one ffn part")
        parts[part.label] = part
    dims = {
        label: _dims(spec, rc.text, part.dims, HYBRID_PART_DIMS[label], _part_refusal(label))
        for label, part in parts.items()
    }
    hybrid = HybridDims(attn=dims["attn"], ffn=dims["ffn"])
    ffn = parts["ffn"]
    if hybrid.attn.p != hybrid.ffn.p:
        _fail(
            spec,
            ffn.pos,
            f"attn and ffn pipeline sizes differ (attn p{hybrid.attn.p}, ffn p{hybrid.ffn.p}) in '{rc.text}'",
            "every pipeline stage holds both attention and FFN layers, so p must match",
        )
    if hybrid.attn.world_size != hybrid.ffn_world_size:
        _fail(
            spec,
            ffn.pos,
            f"attn spans {hybrid.attn.world_size} GPUs (d*t*p*c) but ffn spans {hybrid.ffn_world_size} "
            f"(d*t*p*e) in '{rc.text}'",
            "both layouts cover the same GPUs: make d*t*p*c of attn equal d*t*p*e of ffn",
        )
    return hybrid


def _part_refusal(label: str) -> Refusal:
    return lambda letter: _PART_REFUSALS[(label, letter)]


def _check_names(spec: str, raw: RawSpec) -> None:
    flat = [rc for pool in raw for rc in pool]
    for pool in raw:
        if len(pool) > 1:
            for rc in pool:
                if rc.name is None:
                    _fail(
                        spec,
                        rc.pos,
                        f"colocated component '{rc.text}' has no name",
                        "name every component that shares GPUs, e.g. sglang[rollout]:d4|fsdp[actor]:d4",
                    )
    if len(flat) >= 3:
        for rc in flat:
            if rc.name is None:
                _fail(
                    spec,
                    rc.pos,
                    f"component '{rc.text}' has no name; with {len(flat)} components every one must be named",
                    "add names in brackets, e.g. sglang[rollout]:d2+fsdp[actor]:d4+fsdp[ref]:d2",
                )
    first_seen: dict[str, RawComponent] = {}
    for rc in flat:
        if rc.name is None or rc.name_pos is None:
            continue
        if rc.name in first_seen:
            _fail(
                spec,
                rc.name_pos,
                f"duplicate component name '{rc.name}' (also used by '{first_seen[rc.name].text}')",
                "give each component a unique name",
            )
        first_seen[rc.name] = rc


def _check_colocated_worlds(spec: str, raw: RawSpec, pools: list[list[Component]]) -> None:
    for raw_pool, pool in zip(raw, pools):
        first = pool[0]
        for rc, comp in zip(raw_pool[1:], pool[1:]):
            if comp.world_size != first.world_size:
                _fail(
                    spec,
                    rc.pos,
                    f"colocated components must span the same GPUs: '{rc.text}' needs {comp.world_size} "
                    f"but '{raw_pool[0].text}' needs {first.world_size}",
                    "make their world sizes (d*t*p*c) equal, or use '+' to give them separate GPUs",
                )
