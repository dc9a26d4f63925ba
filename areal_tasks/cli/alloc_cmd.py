"""``areal alloc SPEC [--gpus N]``: parse an allocation spec and print it as JSON.

Exit 0 with the JSON on stdout; an invalid spec raises AllocationError, which the CLI's
``main`` prints (message, caret, hint) on stderr with exit 2. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys

from areal_tasks.config.allocation import parse_allocation


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "alloc",
        help="parse and validate an allocation spec, print it as JSON",
        description=(
            "Parse an allocation-mode spec such as 'sglang:d2+fsdp:d4' and print its components, "
            "dims and GPU count as JSON. See docs/allocation.md for the language."
        ),
    )
    parser.add_argument("spec", help="allocation spec, e.g. 'sglang:d2+fsdp:d4' (quote it in the shell)")
    parser.add_argument(
        "--gpus", type=int, default=None, metavar="N", help="cluster size: fail unless the spec fits in N GPUs"
    )
    parser.set_defaults(handler=run_alloc)


def run_alloc(args: argparse.Namespace) -> int:
    """Print the parsed allocation of ``args.spec`` as indented JSON; AllocationError if invalid."""
    mode = parse_allocation(args.spec, total_gpus=args.gpus)
    sys.stdout.write(json.dumps(mode.to_dict(), indent=2) + "\n")
    return 0
