"""The network interface that carries a node's address, so that gloo and NCCL use it.

gloo resolves the machine's host name to pick the address it listens on; on a node whose name
does not resolve (or resolves to loopback) it falls back to ``127.0.0.1``, and peers on other nodes
then wait minutes for a connection that never comes. :func:`pin_socket_interface` sets
``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` to the interface holding the worker's node
address (``AREAL_NODE_ADDR``, set by every scheduler) when the user set neither and the job spans
more than loopback. Linux only (``SIOCGIFADDR``); elsewhere nothing is set.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import MutableMapping

from areal_tasks.api.scheduler import NODE_ADDR_ENV

logger = logging.getLogger(__name__)

__all__ = ["interface_for", "pin_socket_interface"]

_SIOCGIFADDR = 0x8915
_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _ipv4_of(sock: socket.socket, name: str) -> str | None:
    request = struct.pack("256s", name.encode()[:15])
    try:
        answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
    except OSError:  # the interface has no IPv4 address
        return None
    return socket.inet_ntoa(answer[20:24])


def interface_for(address: str) -> str | None:
    """The name of the local interface whose IPv4 address is ``address``, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            if _ipv4_of(sock, name) == address:
                return name
    return None


def pin_socket_interface(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set the gloo/NCCL interface variables for this worker's node address; return the interface.

    Nothing is set when the user set either variable, when no node address is known or it is a
    loopback address (one machine), or when no interface holds it.
    """
    env = os.environ if environ is None else environ
    if any(env.get(name) for name in _IFNAME_VARS):
        return None
    address = env.get(NODE_ADDR_ENV, "")
    try:
        if not address or ipaddress.ip_address(address).is_loopback:
            return None
    except ValueError:  # a host name, not an address: resolve it
        try:
            address = socket.gethostbyname(address)
        except OSError:
            logger.warning("%s=%s does not resolve; gloo/NCCL pick their interface themselves", NODE_ADDR_ENV, address)
            return None
    name = interface_for(address)
    if name is None:
        logger.warning("no interface of this machine holds %s=%s", NODE_ADDR_ENV, address)
        return None
    for var in _IFNAME_VARS:
        env[var] = name
    logger.info("gloo/NCCL use interface %s (%s)", name, address)
    return name
