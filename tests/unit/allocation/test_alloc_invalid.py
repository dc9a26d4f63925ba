"""Invalid allocation specs: each must fail with a precise message, caret position and hint."""

from __future__ import annotations

import pytest

from areal_tasks.config.allocation import parse_allocation
from areal_tasks.errors import AllocationError

# (spec, fragment of the message, fragment of the hint, 0-based position of the caret)
INVALID = [
    # syntax
    ("fsdp:d", "dim 'd' without a size", "letter and its size", 5),
    ("fsdp:4", "a size without its dim letter", "d4t2", 5),
    ("fsdp:d4x", "dim 'x' without a size", "letter and its size", 7),
    ("fsdpd4", "missing ':' after the backend", "write 'fsdp:d4'", 4),
    ("sglang", "no dims after 'sglang'", "'sglang:d2'", 6),
    ("fsdp:", "missing dims after ':'", "omitted dims are 1", 5),
    ("fsdp.d4", "'.' after the backend", "use ':'", 4),
    ("sglang.d2+fsdp.d4", "'.' after the backend", "use ':'", 6),
    ("d4p2", "missing backend", "'fsdp:d4p2'", 0),
    ("sglang:d2+d4", "missing backend", "'fsdp:d4'", 10),
    ("FSDP:d4", "uppercase letter", "try 'fsdp:d4'", 0),
    ("fsdp:D4", "uppercase letter", "lowercase", 5),
    ("fsdp:d4+", "'+' is not followed by a component", "after '+'", 8),
    ("fsdp:d4|", "'|' is not followed by a component", "after '|'", 8),
    ("sglang:d2++fsdp:d4", "'+' is not followed by a component", "after '+'", 10),
    ("+fsdp:d4", "expected a component", "BACKEND:DIMS", 0),
    ("fsdp:d4,sglang:d2", "',' between components", "'+' between pools", 7),
    ("fsdp:d4;sglang:d2", "';' between components", "'|' between colocated", 7),
    ("fsdp[]:d4", "empty name", "fsdp[actor]:d4", 5),
    ("fsdp[1a]:d4", "must start with a letter", "fsdp[actor]", 5),
    ("fsdp[actor:d4", "missing ']' after the name", "fsdp[actor]:d4", 10),
    ("fsdp:d4[actor]", "a name after the dims", "between backend and ':'", 7),
    ("fsdp:d4:actor", "a second ':'", "BACKEND[NAME]:DIMS", 7),
    ("fsdp:d4)", "unmatched ')'", "hybrid", 7),
    ("megatron:attn:d4|ffn:e4", "hybrid layout without parentheses", "megatron:(attn:", 9),
    ("megatron:(attn:d2|ffn:e2", "missing ')'", "megatron:(attn:", 24),
    ("megatron:(attn:d2|ffn:e2|attn:d2)", "exactly two parts", "(attn:DIMS|ffn:DIMS)", 24),
    ("megatron:(attn d2|ffn:e2)", "unexpected whitespace", "around '+' and '|'", 14),
    ("megatron:(attn|ffn:e2)", "expected ':' after 'attn'", "attn:DIMS", 14),
    ("megatron:(", "expected a hybrid part", "(attn:DIMS|ffn:DIMS)", 10),
    ("megatron:(attn:d2|", "expected a hybrid part", "(attn:DIMS|ffn:DIMS)", 18),
    ("megatron:(attn:", "missing dims after ':'", "at least one dim", 15),
    ("megatron:()", "unmatched ')'", "only a hybrid layout", 10),
    ("fsdp[actor]", "missing ':' after the name", "BACKEND[NAME]:DIMS", 11),
    ("(fsdp:d4)", "expected a component", "BACKEND:DIMS", 0),
    # whitespace
    ("fsdp : d4", "unexpected whitespace", "allowed only around '+' and '|'", 4),
    ("fsdp:d4 p2", "unexpected whitespace", "without spaces", 7),
    ("sglang:d2 fsdp:d4", "unexpected whitespace", "separate components with '+'", 9),
    ("", "empty allocation spec", "sglang:d2+fsdp:d4", None),
    ("   ", "empty allocation spec", "sglang:d2+fsdp:d4", None),
    # backends and dims
    ("fsdpp:d4", "unknown backend 'fsdpp'", "did you mean 'fsdp'?", 0),
    ("sglang:d2+megatorn:d4", "unknown backend 'megatorn'", "did you mean 'megatron'?", 10),
    ("vlm:d2+fsdp:d2", "unknown backend 'vlm'", "did you mean 'vllm'?", 0),
    ("deepspeed:d8", "unknown backend 'deepspeed'", "valid backends are", 0),
    ("fsdp-actor:d4", "unknown backend 'fsdp-actor'", "'fsdp[actor]:DIMS'", 0),
    ("trl+fsdp:d4", "unknown backend 'trl' with no dims", "valid backends", 0),
    ("fsdp:x4", "unknown dim 'x4'", "d (data), t (tensor)", 5),
    ("fsdp:d2d4", "dim 'd' given twice ('d2' and 'd4')", "each dim once", 7),
    ("megatron:t2p2t2", "dim 't' given twice", "each dim once", 13),
    ("fsdp:d0", "dim 'd0' is zero", "at least 1", 5),
    ("sglang:d2t0+fsdp:d2", "dim 't0' is zero", "at least 1", 9),
    (
        "fsdp:d4p2",
        "FSDP has no pipeline parallelism",
        "use megatron (or archon) for pipeline parallelism, or drop p",
        7,
    ),
    ("fsdp:d4e2", "FSDP has no expert parallelism", "use megatron or archon", 7),
    ("sglang:d2c2+fsdp:d4", "sglang takes no context-parallel dim (c)", "drop c", 9),
    ("vllm:e2+fsdp:d4", "vllm takes no expert-parallel dim (e)", "drop e", 5),
    ("embedded:c2", "embedded takes no context-parallel dim", "drop c", 9),
    ("megatron:d2e4", "e4 does not divide d*c = 2", "choose e from [1, 2]", 11),
    ("archon:d3c1e2", "e2 does not divide d*c = 3", "choose e from [1, 3]", 11),
    # hybrid form
    ("fsdp:(attn:d2|ffn:e2)", "MoE hybrid form needs megatron or archon, not fsdp", "plain dims", 0),
    ("sglang:(attn:d2|ffn:e2)", "MoE hybrid form needs megatron or archon, not sglang", "plain dims", 0),
    ("megatron:(atn:d2|ffn:e2)", "unknown hybrid part 'atn'", "did you mean 'attn'?", 10),
    ("megatron:(ffn:d2|ffn:e2)", "hybrid part 'ffn' given twice", "one attn part and one ffn part", 17),
    ("megatron:(attn:d4p2e2|ffn:d2p2e2)", "the attn part takes no expert dim (e)", "belongs to the ffn part", 19),
    ("megatron:(attn:d4p2|ffn:d4p2c2)", "the ffn part takes no context dim (c)", "belongs to the attn part", 28),
    ("megatron:(attn:d4p2|ffn:d2p1e2)", "pipeline sizes differ (attn p2, ffn p1)", "p must match", 20),
    ("megatron:(attn:d4p2|ffn:d2p2e4)", "attn spans 8 GPUs (d*t*p*c) but ffn spans 16", "d*t*p*e of ffn", 20),
    ("megatron:(attn:d2d2|ffn:e4)", "dim 'd' given twice", "each dim once", 17),
    # naming and colocation
    ("sglang:d4|fsdp:d4", "colocated component 'sglang:d4' has no name", "sglang[rollout]:d4|fsdp[actor]:d4", 0),
    ("sglang[rollout]:d4|fsdp:d4", "colocated component 'fsdp:d4' has no name", "name every component", 19),
    ("sglang[a]:d4|fsdp[b]:d8", "'fsdp[b]:d8' needs 8 but 'sglang[a]:d4' needs 4", "use '+'", 13),
    ("sglang[a]:d4|megatron[b]:(attn:d2|ffn:e2)", "needs 2 but 'sglang[a]:d4' needs 4", "world sizes", 13),
    ("sglang:d1+fsdp:d1+fsdp[ref]:d1", "component 'sglang:d1' has no name; with 3 components", "add names", 0),
    ("sglang[a]:d1+fsdp[b]:d1+fsdp:d1", "component 'fsdp:d1' has no name", "add names", 24),
    ("sglang[a]:d1+fsdp[a]:d1", "duplicate component name 'a'", "unique", 18),
    ("sglang[x]:d2|fsdp[x]:d2", "duplicate component name 'x' (also used by 'sglang[x]:d2')", "unique", 18),
]


@pytest.mark.parametrize(("spec", "message", "hint", "position"), INVALID, ids=[repr(v[0]) for v in INVALID])
def test_invalid_specs(spec: str, message: str, hint: str, position: int | None) -> None:
    with pytest.raises(AllocationError) as info:
        parse_allocation(spec)
    err = info.value
    assert message in str(err)
    assert hint in err.hint
    assert err.position == position
    if position is not None:
        assert err.spec == spec
        assert f"at position {position}" in str(err)
        caret_line = str(err).splitlines()[2]
        assert caret_line.index("^") == position + 2  # two spaces of indent, as the spec line


@pytest.mark.parametrize(
    ("spec", "gpus", "needed"),
    [("sglang:d4+fsdp:d8", 8, 12), ("megatron:d2t2p2", 4, 8), ("sglang[a]:d4|fsdp[b]:d4+fsdp[c]:d2", 5, 6)],
)
def test_does_not_fit_cluster(spec: str, gpus: int, needed: int) -> None:
    with pytest.raises(AllocationError, match=f"needs {needed} GPUs but the cluster has {gpus}") as info:
        parse_allocation(spec, total_gpus=gpus)
    assert "GPUs per pool" in info.value.hint


def test_fit_breakdown_counts_a_colocated_group_once() -> None:
    with pytest.raises(AllocationError) as info:
        parse_allocation("sglang[a]:d4|fsdp[b]:d4+fsdp[c]:d2", total_gpus=5)
    assert "sglang[a]:d4|fsdp[b]:d4 = 4 + fsdp[c]:d2 = 2" in info.value.hint


@pytest.mark.parametrize("gpus", [0, -4, True])
def test_bad_cluster_size(gpus: int) -> None:
    with pytest.raises(AllocationError, match="total_gpus must be a positive integer"):
        parse_allocation("fsdp:d1", total_gpus=gpus)


def test_non_string_spec() -> None:
    with pytest.raises(AllocationError, match="must be a string, got int"):
        parse_allocation(4)  # type: ignore[arg-type]


def test_error_is_a_value_error_for_generic_callers() -> None:
    with pytest.raises(ValueError):
        parse_allocation("fsdp:d4p2")
