"""``areal serve``: run the embedded SGLang-protocol inference server.

``areal serve --model DIR [--host H] [--port P] [--dtype D] [--device DEV] [--max-running-requests N]
[--context-length L] [--api-key K] [--admin-api-key K] [--weight-version V] ...`` loads DIR (any HF
causal LM) and serves SGLang's native endpoints plus OpenAI's ``/v1`` routes until interrupted.
Flag names follow SGLang's where they exist (``--model-path``, ``--tokenizer-path`` are accepted
too). Heavy imports happen inside the handler, so ``areal --help`` stays torch-free.

Keys: ``--api-key-env NAME`` / ``--admin-api-key-env NAME`` read the key from the environment
variable NAME, which keeps it off the command line (visible in ``ps`` and in launch logs); the job
launcher uses these. ``--api-key``/``--admin-api-key`` take the key itself (SGLang's flags).

Closed by default (:func:`admin_access`):

* Admin routes (pause, weight updates, groups, aborts) need a key. With neither an API key nor an
  admin key, the server makes an admin key and writes it to a file only this user can read
  (:func:`write_admin_key`), whose path it logs, never the key, and which it removes when it stops
  (:func:`remove_admin_key`); ``--allow-unauthenticated-admin`` opens them instead, with a warning.
* A ``--host`` that is not a loopback address needs an API key (every endpoint), else the server
  refuses to start (exit 2) unless ``--allow-unauthenticated``, with a warning.
* Weight updates read only the served model's directory and ``--weight-root`` directories; weight
  operations, the drain before an update and the stop are bounded (``--weight-*-timeout-s``,
  ``--shutdown-timeout-s``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from areal_tasks.agent.tool_calls import TOOL_CALL_PARSERS
from areal_tasks.inference.server.images import DEFAULT_IMAGE_CACHE_MB
from areal_tasks.inference.server.limits import add_limit_arguments, limits_from_args
from areal_tasks.inference.server.server import DEFAULT_SWITCH_INTERVAL_US, HTTP_FRONTENDS

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the embedded SGLang-protocol inference server",
        description="Serve any Hugging Face causal LM over SGLang's native HTTP API and OpenAI's /v1 routes.",
    )
    parser.add_argument(
        "--model", "--model-path", dest="model", required=True, metavar="DIR", help="HF model directory"
    )
    parser.add_argument(
        "--tokenizer",
        "--tokenizer-path",
        dest="tokenizer",
        default=None,
        metavar="DIR",
        help="tokenizer directory (default: the model directory)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="port (default 30000)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="weights/activations dtype (auto: float32 on CPU, the checkpoint's on CUDA)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=32,
        metavar="N",
        help="sequences decoded together at most = KV cache slots (default 32)",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        metavar="L",
        help="prompt + output tokens per sequence (default: the model's max positions)",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=8192,
        metavar="T",
        help="prompt tokens prefilled between two decode steps at most (default 8192)",
    )
    parser.add_argument("--served-model-name", default=None, help="model name in answers (default: DIR's name)")
    parser.add_argument("--weight-version", default="0", help="initial weight version (default 0)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every endpoint")
    parser.add_argument(
        "--admin-api-key", default=None, help="require 'Authorization: Bearer KEY' on admin and weight-update endpoints"
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="like --api-key, with the key read from the environment variable NAME",
    )
    parser.add_argument(
        "--admin-api-key-env",
        default=None,
        metavar="NAME",
        help="like --admin-api-key, with the key read from the environment variable NAME",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        choices=TOOL_CALL_PARSERS,
        help="parse <tool_call> blocks of chat answers into tool_calls (hermes and qwen25 are the same format)",
    )
    parser.add_argument(
        "--seed",
        "--random-seed",
        dest="seed",
        type=int,
        default=None,
        help="seed of the shared sampling stream (requests may carry their own sampling_seed)",
    )
    parser.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="on CUDA, run decode steps eagerly instead of replaying CUDA graphs",
    )
    parser.add_argument(
        "--disable-torch-compile",
        action="store_true",
        help="on CUDA, keep the norms and MLPs eager instead of torch.compile-fused",
    )
    parser.add_argument(
        "--torch-compile-scope",
        default="blocks",
        choices=("blocks", "pointwise"),
        help="on CUDA, what the captured decode steps compile: whole decoder blocks, attention "
        "included, with fused input projections (blocks, the default) or the norms and "
        "MLPs only (pointwise)",
    )
    parser.add_argument(
        "--decode-attention",
        default="auto",
        choices=("auto", "triton", "sdpa"),
        help="the grouped decode attention: a Triton kernel that reads the cache once (auto: on "
        "CUDA where Triton imports), or SDPA",
    )
    parser.add_argument(
        "--image-cache-mb",
        type=int,
        metavar="MIB",
        default=DEFAULT_IMAGE_CACHE_MB,
        help="host memory (MiB) that a vision-language model's processed images are kept in, by "
        "content, so an image sent again (a GRPO group's n requests, an agent's next turn) is "
        f"processed once (default {DEFAULT_IMAGE_CACHE_MB}; 0 processes every image sent)",
    )
    parser.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="read each decode step's tokens back before launching the next one",
    )
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--http-frontend",
        choices=HTTP_FRONTENDS,
        default="inline",
        help="where HTTP is parsed and answered: inline (in the engine's process, the default) or process "
        "(a front-end process of its own, off the interpreter lock the engine thread uses)",
    )
    parser.add_argument(
        "--switch-interval-us",
        type=float,
        default=DEFAULT_SWITCH_INTERVAL_US,
        metavar="US",
        help="the interpreter's thread switch interval while serving, in microseconds: how long the engine "
        "thread may wait for the interpreter lock while the HTTP loop runs Python "
        f"(default {DEFAULT_SWITCH_INTERVAL_US:g}; Python's own is 5000)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_limit_arguments(parser)
    add_safety_arguments(parser)
    parser.set_defaults(handler=run_serve)


def add_safety_arguments(parser: argparse.ArgumentParser) -> None:
    """Access, weight roots and the bounds of weight operations and of the stop."""
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve on a non-loopback --host without an API key (anyone who reaches it may generate)",
    )
    parser.add_argument(
        "--allow-unauthenticated-admin",
        action="store_true",
        help="without an API key or admin key, open the admin routes to anyone (default: an admin key "
        "is generated and written to a file only you can read)",
    )
    parser.add_argument(
        "--weight-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory weight updates may be read from, besides the model's (repeatable)",
    )
    parser.add_argument(
        "--weight-group-timeout-s",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a weight-update group's rendezvous may take (default 60)",
    )
    parser.add_argument(
        "--weight-load-timeout-s",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a weight load (disk, shared buffer, one received bucket) may take (default 600)",
    )
    parser.add_argument(
        "--weight-update-drain-timeout-s",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds an update on a server that is not paused waits for requests in flight (default 30)",
    )
    parser.add_argument(
        "--enable-prefix-cache",
        action="store_true",
        help="keep finished sequences' KV and reuse cached prompt prefixes (off by default; docs/inference.md)",
    )
    parser.add_argument(
        "--disable-radix-cache",
        "--disable-prefix-cache",
        dest="disable_radix_cache",
        action="store_true",
        help="no prefix cache, even with --enable-prefix-cache (SGLang's flag name)",
    )
    parser.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=15.0,
        metavar="S",
        help="seconds from SIGTERM/SIGINT to the process's exit at most (default 15)",
    )


def resolve_key(key: str | None, env_name: str | None, flag: str, environ: Mapping[str, str]) -> str | None:
    """The key of ``--<flag>`` or of ``--<flag>-env NAME`` (ConfigError when both are given or NAME
    is unset/empty; the messages never show a key)."""
    from areal_tasks.errors import ConfigError

    if env_name is None:
        return key
    if key is not None:
        raise ConfigError(f"give --{flag} or --{flag}-env, not both")
    value = environ.get(env_name, "")
    if not value:
        state = "empty" if env_name in environ else "not set"
        raise ConfigError(f"--{flag}-env {env_name}: the environment variable {env_name} is {state}")
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches only this machine: every address it
    resolves to is a loopback one. An empty host or a wildcard (``0.0.0.0``, ``::``) is not."""
    host = host.strip().strip("[]")
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def admin_key_dir(environ: Mapping[str, str]) -> Path:
    """Where generated admin keys go: ``$XDG_RUNTIME_DIR/areal`` (a per-user tmpfs), else
    ``~/.cache/areal``."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "areal"
    return Path(environ.get("HOME") or Path.home()) / ".cache" / "areal"


def write_admin_key(port: int, environ: Mapping[str, str]) -> tuple[str, Path]:
    """A new admin key and the file it was written to: ``<admin_key_dir>/serve-<port>.admin-key``,
    mode 0600, in a directory of this user that no one else may write (else ConfigError)."""
    from areal_tasks.errors import ConfigError

    directory = admin_key_dir(environ)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ConfigError(
            f"cannot write the generated admin key: {directory} is not a directory only you may write; "
            "give --admin-api-key-env NAME instead"
        )
    key = secrets.token_urlsafe(32)
    path = directory / f"serve-{port}.admin-key"
    staging = directory / f".serve-{port}.admin-key.{os.getpid()}"
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    os.replace(staging, path)
    return key, path


def remove_admin_key(port: int, key: str, environ: Mapping[str, str]) -> None:
    """Delete ``serve-<port>.admin-key`` when the server that wrote ``key`` stops, unless a later
    server on the same port has since replaced it with its own key (then that file is its)."""
    path = admin_key_dir(environ) / f"serve-{port}.admin-key"
    try:
        if path.read_text() == key:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove the admin key file %s: %s", path, exc)


def admin_access(
    args: argparse.Namespace, api_key: str | None, admin_api_key: str | None, environ: Mapping[str, str]
) -> tuple[str | None, bool]:
    """``(admin key, open admin routes)`` for these arguments and keys, by the rules of the module
    docstring; raises ConfigError for a non-loopback ``--host`` without an API key (before any
    model is loaded). Generates and writes the admin key when no key is given."""
    from areal_tasks.errors import ConfigError

    if not is_loopback(args.host) and not api_key:
        if not args.allow_unauthenticated:
            raise ConfigError(
                f"--host {args.host} is not a loopback address and no API key is set: anyone who reaches "
                "it could use the server. Give --api-key-env NAME (or --api-key), or pass "
                "--allow-unauthenticated to serve it open"
            )
        logger.warning("SERVING WITHOUT AN API KEY ON %s: anyone who reaches it may generate", args.host)
    if api_key or admin_api_key:
        return admin_api_key, False
    if args.allow_unauthenticated_admin:
        logger.warning(
            "ADMIN ROUTES OPEN (--allow-unauthenticated-admin): anyone who reaches %s:%d may pause the "
            "server, abort requests or load weights into it",
            args.host,
            args.port,
        )
        return None, True
    key, path = write_admin_key(args.port, environ)
    logger.info(
        "admin routes need the admin key written to %s (send 'Authorization: Bearer <the key>'; "
        "--admin-api-key-env NAME chooses one, --allow-unauthenticated-admin opens them)",
        path,
    )
    return key, False


def safety_config(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`ServerConfig` fields of :func:`add_safety_arguments` (admin access apart)."""
    from areal_tasks.inference.server import WeightBounds

    return {
        "weights": WeightBounds(
            roots=tuple(args.weight_root),
            group_timeout_s=args.weight_group_timeout_s,
            load_timeout_s=args.weight_load_timeout_s,
            drain_timeout_s=args.weight_update_drain_timeout_s,
        ),
        "shutdown_timeout_s": args.shutdown_timeout_s,
    }


def run_serve(args: argparse.Namespace) -> int:
    """Build the server from ``args`` and serve until interrupted; a generated admin key's file is
    removed when the server stops."""
    api_key = resolve_key(args.api_key, args.api_key_env, "api-key", os.environ)
    admin_api_key = resolve_key(args.admin_api_key, args.admin_api_key_env, "admin-api-key", os.environ)
    given_admin_key = admin_api_key
    admin_api_key, open_admin = admin_access(args, api_key, admin_api_key, os.environ)
    generated_key = admin_api_key if admin_api_key is not None and given_admin_key is None else None
    try:
        _serve(args, api_key, admin_api_key, open_admin)
    finally:
        if generated_key is not None:
            remove_admin_key(args.port, generated_key, os.environ)
    return 0


def _serve(args: argparse.Namespace, api_key: str | None, admin_api_key: str | None, open_admin: bool) -> None:
    from areal_tasks.inference.server import ServerConfig, run_server

    cfg = ServerConfig(
        model_path=args.model,
        tokenizer_path=args.tokenizer,
        host=args.host,
        port=args.port,
        dtype=args.dtype,
        device=args.device,
        max_running_requests=args.max_running_requests,
        context_length=args.context_length,
        max_prefill_tokens=args.max_prefill_tokens,
        served_model_name=args.served_model_name,
        weight_version=args.weight_version,
        api_key=api_key,
        admin_api_key=admin_api_key,
        tool_call_parser=args.tool_call_parser,
        seed=args.seed,
        cuda_graphs=not args.disable_cuda_graph,
        prefix_cache=args.enable_prefix_cache and not args.disable_radix_cache,
        torch_compile=not args.disable_torch_compile,
        torch_compile_scope=args.torch_compile_scope,
        decode_attention=args.decode_attention,
        image_cache_mb=args.image_cache_mb,
        overlap_schedule=not args.disable_overlap_schedule,
        num_threads=args.num_threads,
        switch_interval_us=args.switch_interval_us,
        http_frontend=args.http_frontend,
        log_level=args.log_level,
        limits=limits_from_args(args),
        allow_unauthenticated_admin=open_admin,
        **safety_config(args),
    )
    run_server(cfg)
