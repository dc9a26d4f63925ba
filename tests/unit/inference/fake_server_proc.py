"""A stand-in inference server process for the fleet tests (stdlib only, starts in milliseconds).

  python fake_server_proc.py --host H --port P [--exit-code N] [--sick-file PATH]

Serves ``GET /health`` (200, or 503 while PATH holds this server's port) and ``GET
/get_model_info``. With ``--exit-code`` it prints a message and exits at once (a crash on start).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--exit-code", type=int, default=None)
    parser.add_argument("--sick-file", default=None)
    args = parser.parse_args()
    if args.exit_code is not None:
        print("fake server failing on purpose", file=sys.stderr, flush=True)
        sys.exit(args.exit_code)

    def sick() -> bool:
        if not args.sick_file or not os.path.exists(args.sick_file):
            return False
        with open(args.sick_file) as handle:
            return handle.read().strip() == str(args.port)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_response(503 if sick() else 200)
                self.end_headers()
            elif self.path == "/get_model_info":
                body = json.dumps({"model_path": "/fake", "weight_version": "default"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, format: str, *log_args: object) -> None:
            pass  # keep the log for crash reports

    print(f"fake server on {args.host}:{args.port}", flush=True)
    http.server.ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
