"""A tiny worker program for the scheduler tests; the first argument picks what it does.

http PORT                       serve GET /health -> 200 on $AREAL_NODE_ADDR:PORT (127.0.0.1 without it)
                                until killed
touch PATH                      create PATH, then sleep until killed
crash CODE MESSAGE              print MESSAGE to stderr and exit with CODE
ready-then-crash READY TRIGGER CODE
                                create READY, wait for TRIGGER to appear, exit with CODE
stubborn-child READY PIDFILE    start a grandchild that ignores SIGTERM (it writes its pid to
                                PIDFILE, then creates READY); sleep until killed
escaped-child READY PIDFILE     fork a child that leaves the session (setsid), ignores SIGTERM and
                                writes its pid to PIDFILE; then create READY and sleep until killed
dump OUT [ARGS...]              write argv and env as JSON to OUT, print to stdout and stderr, exit 0
sleep                           sleep until killed
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import time


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("health: " + format % args + "\n")


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "http":
        host = os.environ.get("AREAL_NODE_ADDR", "127.0.0.1")
        print(f"serving on {host}:{args[0]}", flush=True)
        http.server.HTTPServer((host, int(args[0])), _Health).serve_forever()
    elif mode == "touch":
        _write(args[0], "ready")
        _sleep_forever()
    elif mode == "crash":
        print(args[1], file=sys.stderr, flush=True)
        return int(args[0])
    elif mode == "ready-then-crash":
        _write(args[0], "ready")
        while not os.path.exists(args[1]):
            time.sleep(0.02)
        print("trigger seen, crashing", file=sys.stderr, flush=True)
        return int(args[2])
    elif mode == "stubborn-child":
        subprocess.Popen([sys.executable, __file__, "ignore-term", *args])
        _sleep_forever()
    elif mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _write(args[1], str(os.getpid()))
        _write(args[0], "ready")
        _sleep_forever()
    elif mode == "escaped-child":
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _write(args[1], str(os.getpid()))
            _sleep_forever()
        while not os.path.exists(args[1]):
            time.sleep(0.01)
        _write(args[0], "ready")
        _sleep_forever()
    elif mode == "dump":
        _write(args[0], json.dumps({"argv": args[1:], "cwd": os.getcwd(), "env": dict(os.environ)}))
        print("hello stdout", flush=True)
        print("hello stderr", file=sys.stderr, flush=True)
    elif mode == "sleep":
        _sleep_forever()
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
