"""``areal serve``: run the embedded SGLang-protocol inference server.

``areal serve --model DIR [--host H] [--port P] [--dtype D] [--device DEV] [--max-running-requests N]
[--context-length L] [--api-key K] [--admin-api-key K] [--weight-version V] ...`` loads DIR (any HF
causal LM) and serves SGLang's native endpoints plus OpenAI's ``/v1`` routes until interrupted.
Flag names follow SGLang's where they exist (``--model-path``, ``--tokenizer-path`` are accepted
too). Heavy imports happen inside the handler, so ``areal --help`` stays torch-free.

Keys: ``--api-key-env NAME`` / ``--admin-api-key-env NAME`` read the key from the environment
variable NAME, which keeps it off the command line (visible in ``ps`` and in launch logs); the job
launcher uses these. ``--api-key``/``--admin-api-key`` take the key itself (SGLang's flags).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from areal_tasks.inference.server.limits import add_limit_arguments, limits_from_args


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
        choices=("qwen25",),
        help="parse <tool_call> blocks of chat answers into tool_calls",
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
        "--disable-overlap-schedule",
        action="store_true",
        help="read each decode step's tokens back before launching the next one",
    )
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_limit_arguments(parser)
    parser.set_defaults(handler=run_serve)


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


def run_serve(args: argparse.Namespace) -> int:
    """Build the server from ``args`` and serve until interrupted."""
    from areal_tasks.inference.server import ServerConfig, run_server

    api_key = resolve_key(args.api_key, args.api_key_env, "api-key", os.environ)
    admin_api_key = resolve_key(args.admin_api_key, args.admin_api_key_env, "admin-api-key", os.environ)
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
        torch_compile=not args.disable_torch_compile,
        torch_compile_scope=args.torch_compile_scope,
        decode_attention=args.decode_attention,
        overlap_schedule=not args.disable_overlap_schedule,
        num_threads=args.num_threads,
        log_level=args.log_level,
        limits=limits_from_args(args),
    )
    run_server(cfg)
    return 0
