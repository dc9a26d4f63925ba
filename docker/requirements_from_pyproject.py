"""Print the requirements of this project (base + chosen extras) from pyproject.toml, one per line.

docker/Dockerfile installs these before it copies the source, so the dependency layer is rebuilt only
when pyproject.toml or constraints.txt change, not on every code edit:

    python requirements_from_pyproject.py pyproject.toml train,serve,storage > requirements.txt

An unknown extra is an error (exit 2) that names the known ones, so a typo in the build argument
fails the build instead of silently installing less.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The base dependencies followed by those of each extra, in order, without duplicates."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise ValueError(f"unknown extra(s) {unknown} in {pyproject}; known: {sorted(optional)}")
    result: list[str] = []
    for requirement in [*project.get("dependencies", []), *(r for extra in extras for r in optional[extra])]:
        if requirement not in result:
            result.append(requirement)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: requirements_from_pyproject.py PYPROJECT EXTRA[,EXTRA...]", file=sys.stderr)
        return 2
    extras = [extra.strip() for extra in argv[1].split(",") if extra.strip()]
    try:
        lines = requirements(Path(argv[0]), extras)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
