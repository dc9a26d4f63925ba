"""Run a server module with API keys taken from environment variables, off its command line.

``python -m areal_tasks.inference.launch.with_keys [--flag FLAG=NAME]... [--env TARGET=NAME]...
MODULE [ARGS...]`` runs ``MODULE`` as ``python -m MODULE ARGS...`` would, after

* ``--flag api-key=NAME``: appending ``--api-key <value of $NAME>`` to ``ARGS`` (SGLang reads its
  keys only from flags), and
* ``--env VLLM_API_KEY=NAME``: setting ``$VLLM_API_KEY`` to the value of ``$NAME`` (vLLM reads it).

The flags are appended to ``sys.argv`` inside this process, after it started: the command line the
kernel shows (``ps``, ``/proc/<pid>/cmdline``) and the one the launcher logs name only the
variables. A variable that is unset or empty stops the launch with a message naming it (exit 2).

Standard library only: it runs in the server's interpreter (``rollout.server.python``), which must
have ``areal_tasks`` installed (the vLLM weight-transfer plugin needs it there anyway).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Mapping, Sequence

__all__ = ["apply_keys", "main"]


def _pair(text: str) -> tuple[str, str]:
    target, sep, name = text.partition("=")
    if not sep or not target or not name or target.startswith("-"):
        raise argparse.ArgumentTypeError(f"expected TARGET=NAME, got {text!r}")
    return target, name


def apply_keys(
    args: Sequence[str],
    flags: Sequence[tuple[str, str]],
    envs: Sequence[tuple[str, str]],
    environ: Mapping[str, str],
) -> tuple[list[str], dict[str, str]]:
    """``(ARGS with ``--FLAG <key>`` appended per ``(FLAG, NAME)`` of ``flags``, the environment
    variables to set)``.

    Raises KeyError naming the first variable in ``flags``/``envs`` that is unset or empty in
    ``environ`` (never showing a value).
    """
    out = list(args)
    new_env: dict[str, str] = {}
    for _, name in [*flags, *envs]:
        if not environ.get(name):
            raise KeyError(name)
    for flag, name in flags:
        out += [f"--{flag}", environ[name]]
    for target, name in envs:
        new_env[target] = environ[name]
    return out, new_env


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m areal_tasks.inference.launch.with_keys",
        description="Run MODULE like python -m, with API keys from environment variables added to it.",
    )
    parser.add_argument(
        "--flag",
        type=_pair,
        action="append",
        default=[],
        metavar="FLAG=NAME",
        help="append --FLAG <value of $NAME> to the module's arguments",
    )
    parser.add_argument(
        "--env",
        type=_pair,
        action="append",
        default=[],
        metavar="TARGET=NAME",
        help="set $TARGET to the value of $NAME",
    )
    parser.add_argument("module", help="the module to run as __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the module's arguments")
    ns = parser.parse_args(argv)
    try:
        args, new_env = apply_keys(ns.args, ns.flag, ns.env, os.environ)
    except KeyError as exc:
        name = exc.args[0]
        parser.exit(
            2,
            f"{parser.prog}: the environment variable {name} (an API key for {ns.module}) is "
            f"{'empty' if name in os.environ else 'not set'}\n",
        )
    os.environ.update(new_env)
    sys.argv = [ns.module, *args]
    runpy.run_module(ns.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
