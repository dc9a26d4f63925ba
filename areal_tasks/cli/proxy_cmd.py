"""``areal proxy``: the agent proxy, an OpenAI-compatible server whose sessions become training samples.

``areal proxy --config FILE [overrides] [--host 127.0.0.1] [--port 8090] --admin-api-key-env NAME
[--export-dir DIR] [--inference-addresses HOST:PORT,...]`` starts the inference servers the job
config names (``rollout.backend``, the embedded one by default) or attaches to running ones, and
serves ``/v1`` (per-session keys) and ``/rl`` (sessions, rewards, finished groups) until SIGINT
or SIGTERM, then stops its servers (``areal_tasks/agent/proxy/launch.py``).

Access, as ``areal serve``'s (``serve_cmd.py``): the admin key is read from the environment
variable ``--admin-api-key-env`` names, never from the command line. Without it the proxy refuses
to start, unless ``--allow-unauthenticated-admin`` on a loopback ``--host`` (admin routes then
open to anyone who reaches it, with a warning); a non-loopback ``--host`` always needs the key.
Heavy imports happen inside the handler, so ``areal --help`` stays torch-free.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping

from areal_tasks.agent.tool_calls import TOOL_CALL_PARSERS

logger = logging.getLogger(__name__)

#: (flag, ProxyLimits field, type, help)
_LIMIT_FLAGS = (
    ("--session-max-concurrent-requests", "max_concurrent_requests", int, "requests of one session in flight (429)"),
    ("--session-max-interactions", "max_interactions", int, "completions one session may record (429)"),
    ("--session-idle-timeout-s", "idle_timeout_s", float, "a session with no request this long ends itself"),
    ("--session-max-lifetime-s", "max_lifetime_s", float, "a session alive this long ends itself"),
    ("--max-open-sessions", "max_open_sessions", int, "open sessions at most (start_session answers 429)"),
    ("--max-body-bytes", "max_body_bytes", int, "request bodies larger than this are refused with 413"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "proxy",
        help="serve the agent proxy: OpenAI-compatible, each session's calls become training samples",
        description=(
            "Start the job config's inference servers (or attach to running ones) and serve an "
            "OpenAI-compatible proxy in front of them: agents call /v1 with a per-session key from "
            "POST /rl/start_session; ended sessions become groups of training samples (GET /rl/groups/next)."
        ),
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="job YAML, e.g. configs/demo_grpo.yaml")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. model.path=tiny:qwen2"
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8090, help="port (default 8090; 0 = a free one, printed)")
    parser.add_argument(
        "--admin-api-key-env",
        default=None,
        metavar="NAME",
        help="the environment variable holding the admin key (start sessions, read groups and status)",
    )
    parser.add_argument(
        "--allow-unauthenticated-admin",
        action="store_true",
        help="on a loopback --host without an admin key, open the admin routes to anyone who reaches it",
    )
    parser.add_argument(
        "--export-dir", default=None, metavar="DIR", help="also append each finished group to DIR/groups.jsonl"
    )
    parser.add_argument(
        "--inference-addresses",
        default=None,
        metavar="HOST:PORT,...",
        help="attach to these running inference servers (rollout.backend's protocol) instead of starting them",
    )
    parser.add_argument(
        "--tool-call-parser",
        default="hermes",
        choices=(*TOOL_CALL_PARSERS, "none"),
        help="how tool calls are parsed from the model's text (none: not parsed; default hermes)",
    )
    for flag, field, kind, text in _LIMIT_FLAGS:
        parser.add_argument(
            flag, dest=field, type=kind, default=None, metavar="N" if kind is int else "S", help=f"{text}"
        )
    parser.set_defaults(handler=run_proxy_cmd)


def admin_key_of(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str | None, bool]:
    """``(admin key, open admin routes)`` by the rules of the module doc (ConfigError otherwise)."""
    from areal_tasks.cli.serve_cmd import is_loopback, resolve_key
    from areal_tasks.errors import ConfigError

    key = resolve_key(None, args.admin_api_key_env, "admin-api-key", environ)
    loopback = is_loopback(args.host)
    if key is not None:
        return key, False
    if not loopback:
        raise ConfigError(
            f"--host {args.host} is not a loopback address: the proxy needs an admin key there; "
            "export one and give --admin-api-key-env NAME"
        )
    if not args.allow_unauthenticated_admin:
        raise ConfigError(
            "the proxy needs an admin key: export one and give --admin-api-key-env NAME "
            "(or --allow-unauthenticated-admin to open the admin routes on this loopback address)"
        )
    logger.warning(
        "ADMIN ROUTES OPEN (--allow-unauthenticated-admin): anyone who reaches %s:%d may start sessions "
        "and read every finished group",
        args.host,
        args.port,
    )
    return None, True


def run_proxy_cmd(args: argparse.Namespace) -> int:
    from areal_tasks.agent.proxy.limits import ProxyLimits
    from areal_tasks.config import load_config

    admin_key, open_admin = admin_key_of(args, os.environ)
    limits = ProxyLimits(
        **{field: getattr(args, field) for _, field, _, _ in _LIMIT_FLAGS if getattr(args, field) is not None}
    )
    cfg = load_config(args.config, args.overrides)
    addresses = [a.strip() for a in (args.inference_addresses or "").split(",") if a.strip()]
    from areal_tasks.agent.proxy.launch import run_proxy
    from areal_tasks.quiet_logs import quiet_third_party_loggers

    quiet_third_party_loggers()
    return run_proxy(
        cfg,
        host=args.host,
        port=args.port,
        admin_api_key=admin_key,
        allow_unauthenticated_admin=open_admin,
        limits=limits,
        export_dir=args.export_dir,
        addresses=addresses or None,
        tool_call_parser=None if args.tool_call_parser == "none" else args.tool_call_parser,
    )
