"""``areal config``: show or validate a job configuration.

    areal config show [FILE] [KEY=VALUE ...]        print the resolved YAML (defaults when no FILE)
    areal config validate FILE [KEY=VALUE ...]      print "OK: FILE (<hash>)" or every problem (exit 2)

``--write`` also writes the resolved config to ``<experiment.run_dir>/config.yaml``. Secrets
(``storage.options.secret``, URL passwords...) are shown and written as ``***``; ``show
--show-secrets`` prints the real values (for debugging, on your own terminal). Give secrets through
``$AREAL_CONFIG_SECRETS`` (JSON ``{dotted.path: value}``) rather than as overrides, which ``ps`` shows.
"""

from __future__ import annotations

import argparse
import logging
import sys

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)


def _split(items: list[str], *, file_required: bool) -> tuple[str | None, list[str]]:
    """``(file, overrides)``: the first item is the file unless it looks like ``KEY=VALUE``."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    if file_required:
        raise ConfigError("a config FILE is required, e.g. areal config validate configs/demo_grpo.yaml")
    return None, items


def _show(args: argparse.Namespace) -> int:
    from areal_tasks.config import config_hash, dump_config_yaml, load_config, write_resolved

    path, overrides = _split(args.items, file_required=False)
    cfg = load_config(path, overrides)
    shown = dump_config_yaml(cfg, show_secrets=args.show_secrets)
    sys.stdout.write(f"# config_hash: {config_hash(cfg)}\n{shown}")
    if args.write:
        sys.stderr.write(f"wrote {write_resolved(cfg)}\n")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from areal_tasks.config import config_hash, load_config, write_resolved

    path, overrides = _split(args.items, file_required=True)
    cfg = load_config(path, overrides)
    sys.stdout.write(f"OK: {path} ({config_hash(cfg)})\n")
    if args.write:
        sys.stdout.write(f"wrote {write_resolved(cfg)}\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``areal config show|validate``."""
    parser = subparsers.add_parser("config", help="show or validate a job configuration")
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    for name, handler, help_text, file_help in (
        ("show", _show, "print the resolved configuration as YAML", "[FILE] [KEY=VALUE ...]"),
        ("validate", _validate, "check a configuration; exit 2 listing every problem", "FILE [KEY=VALUE ...]"),
    ):
        action = actions.add_parser(name, help=help_text, description=help_text)
        action.add_argument(
            "items",
            nargs="*",
            metavar="ARG",
            help=f"{file_help}: a YAML file, then dotted overrides such as actor.optimizer.lr=1e-6",
        )
        action.add_argument("--write", action="store_true", help="also write <run_dir>/config.yaml (redacted)")
        if name == "show":
            action.add_argument(
                "--show-secrets", action="store_true", help="print secret values instead of *** (debugging)"
            )
        action.set_defaults(handler=handler)
