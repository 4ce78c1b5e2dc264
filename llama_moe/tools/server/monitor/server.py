"""The monitor's HTTP server on 127.0.0.1: the page at / (and /monitor.html), and /metrics proxied from the
llama-server, so the page reads it from its own origin whatever the server's CORS settings."""
from __future__ import annotations

import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import requests

log = logging.getLogger(__name__)


def monitor_html() -> bytes:
    return resources.files(__package__).joinpath("monitor.html").read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: "MonitorServer"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path in ("/", "/monitor.html"):
            self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
        elif path == "/metrics":
            self._proxy()
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def _proxy(self) -> None:
        s = self.server
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        try:
            r = requests.get(s.upstream + "/metrics", timeout=s.timeout, headers=headers)
        except requests.RequestException as exc:
            # 502 with the reason, which the page shows as its status
            self._send(HTTPStatus.BAD_GATEWAY, f"cannot reach {s.upstream}: {exc}\n".encode(), "text/plain")
            return
        self._send(r.status_code, r.content, r.headers.get("Content-Type", "text/plain; version=0.0.4"))

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Llama-Moe-Server", self.server.upstream)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("monitor: " + format, *args)   # a poll a second would flood the terminal


class MonitorServer(ThreadingHTTPServer):
    """Serves the monitor for one llama-server. ``port=0`` picks a free port (see ``url``)."""

    daemon_threads = True

    def __init__(self, upstream: str, port: int = 8099, host: str = "127.0.0.1", api_key: str | None = None,
                 timeout: float = 5.0) -> None:
        super().__init__((host, port), _Handler)
        self.upstream = upstream.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.page = monitor_html()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> threading.Thread:
        """Serve on a daemon thread (tests, notebooks); ``shutdown()`` stops it."""
        t = threading.Thread(target=self.serve_forever, name="llama_moe-monitor", daemon=True)
        t.start()
        return t
