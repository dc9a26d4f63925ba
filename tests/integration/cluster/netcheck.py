"""Tiny TCP probes the namespace-cluster tests run inside nodes (standard library only, run with ``-I``).

``serve PORT COUNT`` listens on 0.0.0.0:PORT, answers COUNT connections with ``<hostname> <peer
address>`` and exits. ``connect HOST PORT WAIT`` prints ``ok <answer>`` or ``errno <n>``, retrying a
refused connection for up to WAIT seconds (the server may not listen yet). ``resolve NAME`` prints
the address NAME resolves to. The host imports :func:`connect` directly.
"""

from __future__ import annotations

import errno
import socket
import sys
import time


def serve(port: int, count: int) -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
        listener.listen()
        listener.settimeout(30.0)
        for _ in range(count):
            conn, peer = listener.accept()
            with conn:
                conn.sendall(f"{socket.gethostname()} {peer[0]}".encode())


def connect(host: str, port: int, wait: float) -> str:
    deadline = time.monotonic() + wait
    while True:
        try:
            with socket.create_connection((host, port), timeout=5.0) as conn:
                return "ok " + conn.recv(200).decode()
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            return f"errno {exc.errno}"


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "serve":
        serve(int(args[0]), int(args[1]))
    elif command == "connect":
        print(connect(args[0], int(args[1]), float(args[2])))
    elif command == "resolve":
        print(socket.gethostbyname(args[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")
