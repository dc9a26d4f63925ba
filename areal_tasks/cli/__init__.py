"""The ``areal`` command.

Each command group lives in its own module exposing ``register(subparsers)``; its handlers
return an exit code. Importing this package is torch-free so ``areal --help`` is instant.
User errors (any :class:`~areal_tasks.errors.AReaLError`) print one clear message to stderr and exit 2,
never a traceback. Everything the command prints about a failure, and every log line, goes through
:mod:`storage.redact`: a secret given on the command line, in the config or through
``$AREAL_CONFIG_SECRETS`` does not come back in an error message.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from areal_tasks import __version__
from areal_tasks.errors import AReaLError

#: command modules, each with ``register(subparsers) -> None``; imported lazily only to register.
COMMAND_MODULES: tuple[str, ...] = (
    "areal_tasks.cli.config_cmd",
    "areal_tasks.cli.alloc_cmd",
    "areal_tasks.cli.model_cmd",
    "areal_tasks.cli.serve_cmd",
    "areal_tasks.cli.proxy_cmd",
    "areal_tasks.cli.storage_cmd",
    "areal_tasks.cli.checkpoint_cmd",
    "areal_tasks.cli.train_cmd",
    "areal_tasks.cli.launch_cmd",
    "areal_tasks.cli.eval_cmd",
    "areal_tasks.cli.report_cmd",
)

USAGE_ERROR = 2

logger = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (argparse's own convention, made explicit)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from storage.redact import redact_text

        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {redact_text(message)}\n")
        raise SystemExit(USAGE_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="areal", description="areal-tasks: asynchronous RL for LLMs, run as a managed job.")
    parser.add_argument("--version", action="version", version=f"areal-tasks {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s [areal] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from storage.redact import install_log_redaction, redact_argv, redact_text

    install_log_redaction()
    given = list(sys.argv[1:] if argv is None else argv)
    if redact_argv(given) != given:
        logger.warning(
            "this command line carries a secret (%s): every user of this machine can read it with `ps`; "
            "give config secrets through $AREAL_CONFIG_SECRETS and S3 credentials through AWS_* instead",
            " ".join(redact_argv(given)),
        )
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except AReaLError as exc:
        sys.stderr.write(f"areal {args.command}: error: {redact_text(str(exc))}\n")
        return USAGE_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception:  # noqa: BLE001 - a bug, not a usage error: its traceback, redacted like the rest
        sys.stderr.write(redact_text(traceback.format_exc()))
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
