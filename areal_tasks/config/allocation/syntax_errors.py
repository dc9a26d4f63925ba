"""Turn lark's parse exceptions into an AllocationError with a position and a useful hint.

Lark reports *where* parsing stopped and *which terminals* it expected; this module reads the
text around that spot to guess what the user meant (a missing ``:``, the old ``sglang.d2``
form, a dim without its size, a stray ``,`` ...) and says so.
"""

from __future__ import annotations

import re

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from areal_tasks.config.allocation.backends import ALL_BACKENDS, HYBRID_BACKENDS, backend_hint
from areal_tasks.errors import AllocationError

_EXPECTED_WORDS: dict[str, str] = {
    "IDENT": "a backend such as 'fsdp'",
    "COLON": "':'",
    "LSQB": "'[' (a name)",
    "RSQB": "']'",
    "DIM": "a dim such as 'd4'",
    "LPAR": "'(' (a hybrid layout)",
    "RPAR": "')'",
    "VBAR": "'|'",
    "PLUS": "'+'",
    "$END": "the end",
}

_WORD_BEFORE = re.compile(r"([a-z][a-z0-9_\-]*)\s*$")
_DIMS_ONLY = re.compile(r"(?:[a-z][0-9]+)+")
_SEPARATOR_TYPOS = ",;/&"

#: (problem, hint, caret position) for one recognised mistake.
Diagnosis = tuple[str, str, int]


def syntax_error(spec: str, exc: UnexpectedInput) -> AllocationError:
    """An AllocationError for ``exc`` raised while parsing ``spec``."""
    at_end, expected = _where(spec, exc)
    pos = len(spec.rstrip()) if at_end else exc.pos_in_stream
    recognised = _diagnose(spec, pos, at_end, expected)
    if recognised is None:
        found = "the end of the spec" if at_end else repr(spec[pos])
        wanted = ", ".join(_EXPECTED_WORDS.get(t, t) for t in sorted(expected))
        problem, hint = f"unexpected {found} (expected {wanted})", "see docs/allocation.md for the grammar"
    else:
        problem, hint, pos = recognised
    return AllocationError(f"invalid allocation spec: {problem} at position {pos}", spec=spec, position=pos, hint=hint)


def _where(spec: str, exc: UnexpectedInput) -> tuple[bool, set[str]]:
    """(stopped at end of input?, expected terminal names)."""
    if isinstance(exc, UnexpectedToken):
        return exc.token.type == "$END", set(exc.expected)
    if isinstance(exc, UnexpectedCharacters):
        return False, set(exc.allowed or ())
    return True, set(getattr(exc, "expected", ()) or ())


def _diagnose(spec: str, pos: int, at_end: bool, expected: set[str]) -> Diagnosis | None:
    """(problem, hint, caret position) for a recognised mistake, else None."""
    ch = "" if at_end else spec[pos]
    before = spec[:pos].rstrip()
    if ch.isupper():
        return "uppercase letter", f"allocation specs are lowercase: try '{spec.lower()}'", pos
    if ch == ")" and "RPAR" not in expected:
        return "unmatched ')'", "only a hybrid layout uses parentheses: backend:(attn:DIMS|ffn:DIMS)", pos
    if "COLON" in expected and "LSQB" in expected:
        return _missing_colon(spec, pos, ch, before)
    if "COLON" in expected and before.endswith("]"):
        return "missing ':' after the name", "a named component is BACKEND[NAME]:DIMS, e.g. fsdp[actor]:d4", pos
    if "COLON" in expected:
        return "expected ':' after 'attn' / 'ffn'", "write each hybrid part as attn:DIMS or ffn:DIMS", pos
    if "RSQB" in expected:
        return "missing ']' after the name", "close the name: e.g. fsdp[actor]:d4", pos
    if expected == {"IDENT"} and before.count("(") > before.count(")"):
        return "expected a hybrid part", "a hybrid layout is backend:(attn:DIMS|ffn:DIMS)", pos
    if expected == {"IDENT"}:
        return _missing_component(pos, ch, before)
    if "DIM" in expected:
        return _bad_dims(spec, pos, ch, at_end, expected)
    if "RPAR" in expected:
        if at_end:
            return "missing ')' to close the hybrid layout", "e.g. megatron:(attn:d4p2|ffn:d2p2e2)", pos
        return "a hybrid layout has exactly two parts", "write backend:(attn:DIMS|ffn:DIMS)", pos
    return None


def _missing_colon(spec: str, pos: int, ch: str, before: str) -> Diagnosis:
    """Where ``:`` or ``[`` must follow the identifier just read."""
    if ch == ".":
        hint = "use ':' between backend and dims, e.g. 'sglang:d2' (the old 'sglang.d2' form is not accepted)"
        return "'.' after the backend", hint, pos
    match = _WORD_BEFORE.search(before)
    word = match.group(1) if match else ""
    start = match.start(1) if match else pos
    if _DIMS_ONLY.fullmatch(word):
        return "missing backend", f"every component is BACKEND:DIMS, e.g. 'fsdp:{word}' or 'sglang:{word}'", start
    for backend in sorted(ALL_BACKENDS, key=len, reverse=True):
        if word.startswith(backend) and _DIMS_ONLY.fullmatch(word[len(backend) :]):
            return "missing ':' after the backend", f"write '{backend}:{word[len(backend) :]}'", start + len(backend)
    if word and ch in ("", "+", "|"):
        if word in ALL_BACKENDS:
            return f"no dims after '{word}'", f"write BACKEND:DIMS, e.g. '{word}:d2'", pos
        return f"unknown backend '{word}' with no dims", backend_hint(word), start
    return "expected ':' after the backend", "write BACKEND:DIMS or BACKEND[NAME]:DIMS, e.g. 'fsdp[actor]:d4'", pos


def _missing_component(pos: int, ch: str, before: str) -> Diagnosis:
    """Where a component (or a name inside ``[...]``) must start."""
    op = before[-1:] if before else ""
    if op in ("+", "|") and (not ch or ch in "+|"):
        hint = f"write a component after '{op}', e.g. 'sglang:d2+fsdp:d4'"
        return f"'{op}' is not followed by a component", hint, pos
    if ch == "]":
        return "empty name", "a name starts with a letter, e.g. fsdp[actor]:d4", pos
    if ch.isdigit():
        return "a backend or name must start with a letter", "e.g. fsdp[actor]:d4", pos
    return "expected a component", "a component is BACKEND:DIMS or BACKEND[NAME]:DIMS, e.g. 'fsdp[actor]:d4'", pos


def _bad_dims(spec: str, pos: int, ch: str, at_end: bool, expected: set[str]) -> Diagnosis:
    """Where a dim (or, after ``:``, a ``(``) was one of the things expected."""
    if at_end:  # only reachable before a dim is written, or inside an unclosed hybrid layout
        if spec.rstrip().endswith(":"):
            return "missing dims after ':'", "write at least one dim, e.g. fsdp:d4 (omitted dims are 1)", pos
        return "missing ')' to close the hybrid layout", "e.g. megatron:(attn:d4p2|ffn:d2p2e2)", pos
    if "LPAR" in expected and re.match(r"(attn|ffn)\s*:", spec[pos:]):
        backends = " and ".join(HYBRID_BACKENDS)
        return (
            "hybrid layout without parentheses",
            f"wrap the two parts in parentheses, e.g. megatron:(attn:d4p2|ffn:d2p2e2) ({backends} only)",
            pos,
        )
    if ch and ch in _SEPARATOR_TYPOS:
        hint = "use '+' between pools on separate GPUs and '|' between colocated components"
        return f"'{ch}' between components", hint, pos
    if ch == "[":
        return "a name after the dims", "put the name between backend and ':', e.g. fsdp[actor]:d4", pos
    if ch == ":":
        return "a second ':'", "a component is BACKEND[NAME]:DIMS, e.g. fsdp[actor]:d4", pos
    if ch.isdigit():
        return "a size without its dim letter", "each dim is a letter and its size, e.g. d4t2", pos
    if ch.isalpha():
        return f"dim '{ch}' without a size", "each dim is a letter and its size, e.g. d4t2 (omitted dims are 1)", pos
    return "unexpected " + repr(ch), "a component is BACKEND[NAME]:DIMS, e.g. fsdp[actor]:d4t2", pos
