"""``python -m llama_moe monitor --server URL``: serve monitor.html on 127.0.0.1, a live view of a
llama-server's MoE cache (its /metrics: start it with --metrics)."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import MonitorError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("monitor", help="serve a live web view of a llama-server's MoE cache")
    p.add_argument("--server", default="http://127.0.0.1:8080",
                   help="the llama-server, started with --metrics (default http://127.0.0.1:8080)")
    p.add_argument("--port", type=int, default=8099, help="the monitor's port on 127.0.0.1 (default 8099; 0: any free)")
    p.add_argument("--api-key", help="the server's --api-key, if it has one (default: $LLAMA_API_KEY)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..server.monitor import MonitorServer

    if not 0 <= args.port < 65536:
        raise MonitorError(f"--port must be from 0 (any free port) to 65535, got {args.port}")
    if not args.server.startswith(("http://", "https://")):
        raise MonitorError(f"--server must be an http:// or https:// URL, got {args.server!r}")
    try:
        httpd = MonitorServer(args.server, args.port, api_key=args.api_key or os.environ.get("LLAMA_API_KEY"))
    except OSError as exc:
        raise MonitorError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from exc
    # the first line names the URL, so scripts (and the tests) can read the port chosen by --port 0
    print(f"monitor: {httpd.url} (reading {httpd.upstream}/metrics; Ctrl-C stops)", flush=True)
    with httpd:
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            print("", file=sys.stderr)
    return 0
