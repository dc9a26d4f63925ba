r"""Answer extraction and comparison for math benchmarks: GSM8K (a final number) and MATH (``\boxed``).

Torch-free and dependency-free (``math-verify`` is not required). Two extractors and one comparator:

- :func:`extract_gsm8k_answer`: the final number of a completion, in order of preference after
  ``####``, after ``Answer:`` / ``answer is``, inside the last ``\boxed{}``, else the last number in
  the text; thousands commas, ``$``, a trailing period and the unicode minus are handled, and the
  result is canonical (``"1,234.50"`` -> ``"1234.5"``).
- :func:`extract_math_answer`: the content of the last ``\boxed{...}`` / ``\fbox{...}`` (nested
  braces matched), else the rest of the last ``Answer:`` line.
- :func:`math_equal`: both sides go through :func:`normalize_math_answer` (simple LaTeX:
  ``\dfrac``/``\frac{a}{b}`` -> ``a/b``, ``\left``/``\right``, spaces, trailing ``.``,
  ``^\circ``, ``\%``, trailing ``\text{...}`` units, ``x=`` prefixes); when both parse as numbers
  (integers, decimals, fractions) they compare exactly as rationals (or within ``rel_tol``),
  otherwise as normalised strings.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

logger = logging.getLogger(__name__)

_UNICODE = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " "})

# a number as written in prose: optional sign (not glued to a preceding word, so ``3-5`` gives 5),
# optional ``$``, digits with optional thousands commas, optional decimals.
_PROSE_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)\]])[-+])?\s*(?:\\?\$\s*(?P<sign2>-)?)?(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
)
_HASHES = re.compile(r"####")
_ANSWER_MARK = re.compile(r"(?i)\banswer\s*(?:is\s*:?|:)")
_BOX = re.compile(r"\\(?:boxed|fbox)")

# a plain number after normalisation: sign, digits (thousands commas allowed), decimals, exponent.
_NUM = r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(_NUM)
_FRACTION_RE = re.compile(rf"(?P<neg>-)?\(?(?P<a>{_NUM})\)?/\(?(?P<b>{_NUM})\)?")


def canonical_number(value: Fraction) -> str:
    """``Fraction(2469, 2)`` -> ``"1234.5"``, ``Fraction(42)`` -> ``"42"``; non-terminating -> ``"a/b"``."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = 0
    scaled = value
    while scaled.denominator != 1:
        scaled *= 10
        places += 1
    digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _prose_numbers(text: str) -> list[str]:
    """Every number in ``text`` as a canonical string, in order."""
    found = []
    for m in _PROSE_NUMBER.finditer(text):
        value = Fraction(m.group("num").replace(",", ""))
        if m.group("sign") == "-" or m.group("sign2"):
            value = -value
        found.append(canonical_number(value))
    return found


def _line_after(text: str, end: int) -> str:
    newline = text.find("\n", end)
    return text[end:] if newline < 0 else text[end:newline]


def _closing_brace(text: str, i: int) -> int | None:
    """The index of the ``}`` that closes the ``{`` at ``text[i]`` (nesting counted); None if it never closes."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


def extract_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` or ``\fbox{...}`` (nested braces matched; also the
    brace-less ``\boxed 5``); None when there is none or its braces never close."""
    for m in reversed(list(_BOX.finditer(text))):
        i = m.end()
        if text.startswith("{", i):
            j = _closing_brace(text, i)
            if j is not None:
                return text[i + 1 : j].strip()
            continue  # unbalanced: try an earlier box
        if text.startswith(" ", i):
            bare = re.match(r"\s+([^\s$]+)", text[i:])
            if bare:
                return bare.group(1)
    return None


def _announced_number(line: str) -> str | None:
    """The number a ``####`` / ``Answer:`` line announces: the whole line when it is one value
    (``3/4`` is one value, not the numbers 3 and 4), else its first number; None if it has none."""
    whole = parse_number(line.strip().rstrip(".")) if "/" in line else None
    if whole is not None:
        return canonical_number(whole)
    numbers = _prose_numbers(line)
    return numbers[0] if numbers else None


def extract_gsm8k_answer(text: str) -> str | None:
    """The final number of a GSM8K-style completion (or reference), canonical; None if it has none."""
    text = text.translate(_UNICODE)
    hashes = list(_HASHES.finditer(text))
    if hashes:
        announced = _announced_number(_line_after(text, hashes[-1].end()))
        if announced is not None:
            return announced
    for mark in reversed(list(_ANSWER_MARK.finditer(text))):
        announced = _announced_number(_line_after(text, mark.end()))
        if announced is not None:
            return announced
    boxed = extract_boxed(text)
    if boxed is not None:
        value = parse_number(boxed)
        if value is not None:
            return canonical_number(value)
        numbers = _prose_numbers(boxed)
        if numbers:
            return numbers[-1]
    numbers = _prose_numbers(text)
    return numbers[-1] if numbers else None


def extract_math_answer(text: str) -> str | None:
    r"""The answer of a MATH-style completion: the last ``\boxed{}``, else the rest of the last
    ``Answer:`` line (``$`` and a trailing period stripped); None when there is neither."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    marks = list(_ANSWER_MARK.finditer(text))
    if marks:
        rest = _line_after(text, marks[-1].end()).strip().rstrip(".").strip().strip("$").strip().rstrip(".").strip()
        return rest or None
    return None


def _brace_arg(s: str, i: int) -> tuple[str, int] | None:
    """The argument starting at ``s[i]`` (``{...}`` or one character) and the index after it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] != "{":
        return s[i], i + 1
    j = _closing_brace(s, i)
    return None if j is None else (s[i + 1 : j], j + 1)


def _simple(arg: str) -> bool:
    return re.fullmatch(r"-?[\w.]+", arg) is not None


def _rewrite_fracs(s: str) -> str:
    r"""``\frac{a}{b}`` / ``\frac12`` -> ``a/b`` (parenthesised when not a single term)."""
    out = []
    i = 0
    while True:
        j = s.find("\\frac", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        num = _brace_arg(s, j + 5)
        den = _brace_arg(s, num[1]) if num else None
        if num is None or den is None:
            out.append(s[i:])
            return "".join(out)
        a, b = _rewrite_fracs(num[0]), _rewrite_fracs(den[0])
        a = a if _simple(a) else f"({a})"
        b = b if _simple(b) else f"({b})"
        out.append(s[i:j] + f"{a}/{b}")
        i = den[1]


def _strip_outer_braces(s: str) -> str:
    while s.startswith("{") and s.endswith("}") and _brace_arg(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1]
    return s


def normalize_math_answer(answer: str) -> str:
    """A canonical string for comparing simple LaTeX answers (see the module docstring)."""
    s = answer.translate(_UNICODE).strip()
    s = s.replace("\n", "").replace("\\$", "").replace("$", "")
    s = re.sub(r"\\[!,;: ]", " ", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\(?:big|Big|bigg|Bigg)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("\\circ", "")
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    # a trailing unit in \text{...} after a value: "5\text{ cm}" -> "5"
    unit = re.fullmatch(r"(.*\S)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}\s*", s)
    if unit and re.search(r"\d", unit.group(1)):
        s = unit.group(1)
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\sqrt(?![a-zA-Z{])\s*(\w)", r"\\sqrt{\1}", s)
    s = _rewrite_fracs(s)
    s = s.replace(" ", "")
    s = _strip_outer_braces(s)
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        if re.fullmatch(r"[a-zA-Z](?:_\w+|_\{\w+\})?", lhs):
            s = rhs
    s = s.rstrip(".")
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)
    return s


def parse_number(answer: str) -> Fraction | None:
    """The exact value of a normalised answer that is a number or a fraction of numbers, else None."""
    s = normalize_math_answer(answer)
    if _NUMBER_RE.fullmatch(s):
        return Fraction(s.replace(",", ""))
    m = _FRACTION_RE.fullmatch(s)
    if m:
        den = Fraction(m.group("b").replace(",", ""))
        if den == 0:
            return None
        value = Fraction(m.group("a").replace(",", "")) / den
        return -value if m.group("neg") else value
    return None


def math_equal(pred: str | None, ref: str | None, *, rel_tol: float = 0.0) -> bool:
    """Whether ``pred`` states the same answer as ``ref``: numerically when both parse as numbers
    (exactly, or within ``rel_tol`` of the larger magnitude), else as normalised strings."""
    if pred is None or ref is None:
        return False
    a, b = parse_number(pred), parse_number(ref)
    if a is not None and b is not None:
        if rel_tol:
            return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))
        return a == b
    return normalize_math_answer(pred) == normalize_math_answer(ref)
