"""Inference server lifecycle: command lines per backend and the ``ServerFleet`` that runs them.

Torch-free: ``build_server_command(cfg, model_path)`` and ``ServerFleet.from_config(scheduler,
cfg, model_path)`` only build argv lists and hand them to the Scheduler.
"""

from areal_tasks.inference.launch.commands import (
    ServerArgs,
    ServerCommand,
    ServerLayout,
    build_server_command,
    server_args,
    server_layout,
)
from areal_tasks.inference.launch.fleet import ServerFleet

__all__ = [
    "ServerArgs",
    "ServerCommand",
    "ServerFleet",
    "ServerLayout",
    "build_server_command",
    "server_args",
    "server_layout",
]
