"""``areal proxy``'s body: the job's inference servers, engine and tokenizer, and the proxy until a signal.

:func:`run_proxy` builds what the trainer builds for its rollouts, from the same job config:

* the servers: started through the job's scheduler as :class:`~areal_tasks.inference.launch.ServerFleet`
  (``rollout.backend``; the embedded server by default), or, with ``addresses``, the running servers
  at those ``host:port`` addresses (what the RL workers get in ``$AREAL_INFERENCE_ADDRESSES``);
* the engine: :meth:`RemoteInferenceEngine.from_rollout` (keys, timeouts, retries, concurrency);
* the tokenizer of ``model.path`` (a ``tiny:`` path builds the kit's tiny model);
* the sampling defaults: ``rollout.sampling``.

It serves until SIGINT or SIGTERM, then stops the proxy (its open sessions end and are exported)
and the servers it started. ``export_dir``: each finished group is also appended to
``<export_dir>/groups.jsonl`` (concat style), one JSON object per line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.agent.proxy.limits import ProxyLimits
from areal_tasks.agent.proxy.session import SessionResult

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["jsonl_exporter", "run_proxy"]

#: the file ``--export-dir`` appends finished groups to.
GROUPS_FILE = "groups.jsonl"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def jsonl_exporter(export_dir: str | os.PathLike[str]) -> Callable[[SessionResult], None]:
    """An ``on_group`` that appends each group (concat style) as one line of ``<export_dir>/groups.jsonl``."""
    path = Path(export_dir) / GROUPS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)

    def export(result: SessionResult) -> None:
        line = json.dumps(result.to_dict("concat"), ensure_ascii=False)
        with path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    return export


async def _serve(cfg: JobConfig, addresses: Sequence[str], tokenizer: Any, proxy_kwargs: dict[str, Any]) -> None:
    from areal_tasks.agent.proxy.server import ProxyServer
    from areal_tasks.api.inference import SamplingParams
    from areal_tasks.inference.client import RemoteInferenceEngine

    engine = RemoteInferenceEngine.from_rollout(cfg.rollout, addresses)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        proxy = ProxyServer(
            engine, tokenizer, sampling=SamplingParams.from_config(cfg.rollout.sampling), **proxy_kwargs
        )
        await proxy.start()
        # the line a launcher waits for (stdout, flushed): the proxy answers from here on
        print(f"areal proxy serving on {proxy.url}", flush=True)
        try:
            await stop.wait()
            logger.info("stopping the agent proxy")
        finally:
            await proxy.stop()
    finally:
        for sig, handler in previous.items():  # the scheduler's handlers again, while the servers stop
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
        await engine.aclose()


def run_proxy(
    cfg: JobConfig,
    *,
    host: str,
    port: int,
    admin_api_key: str | None,
    allow_unauthenticated_admin: bool = False,
    limits: ProxyLimits | None = None,
    export_dir: str | None = None,
    addresses: Sequence[str] | None = None,
    tool_call_parser: str | None = "hermes",
) -> int:
    """Serve the proxy over ``cfg``'s inference servers until SIGINT/SIGTERM (see the module doc)."""
    from areal_tasks.inference.launch.commands import key_servers_off_loopback
    from areal_tasks.models.tokenizer import load_tokenizer
    from areal_tasks.trainer.sft import resolve_model_dir

    cfg = key_servers_off_loopback(cfg, os.environ)
    model_dir = resolve_model_dir(cfg)
    tokenizer = load_tokenizer(model_dir)
    proxy_kwargs: dict[str, Any] = {
        "admin_api_key": admin_api_key,
        "allow_unauthenticated_admin": allow_unauthenticated_admin,
        "host": host,
        "port": port,
        "limits": limits,
        "tool_call_parser": tool_call_parser,
        "model_name": Path(cfg.model.path).name or "areal",
        "on_group": jsonl_exporter(export_dir) if export_dir else None,
    }
    if addresses:
        asyncio.run(_serve(cfg, list(addresses), tokenizer, proxy_kwargs))
        return 0
    from areal_tasks.inference.launch import ServerFleet
    from areal_tasks.launch.registry import make_scheduler_for

    scheduler = make_scheduler_for(cfg)
    try:
        fleet = ServerFleet.from_config(scheduler, cfg, model_dir)
        try:
            started = fleet.start()
            asyncio.run(_serve(cfg, started, tokenizer, proxy_kwargs))
        finally:
            fleet.stop()
    finally:
        scheduler.stop_all()
    return 0
