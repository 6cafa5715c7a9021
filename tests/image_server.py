"""A local HTTP server for the image URL tests (``serve --allow-image-urls``): http.server on
127.0.0.1 in a thread, answering each path from a table, and recording every request it got
(so a test can show that a refused URL was never fetched)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A route writes its whole answer; the helpers below make the usual ones.
Route = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Served:
    base: str  # http://127.0.0.1:PORT
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Host header)

    def url(self, path: str) -> str:
        return self.base + path


def body(data: bytes, status: int = 200, **headers: str) -> Route:
    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in {"Content-Length": str(len(data)), **headers}.items():
            handler.send_header(name.replace("_", "-"), value)
        handler.end_headers()
        handler.wfile.write(data)

    return route


def redirect(location: str, status: int = 302) -> Route:
    return body(b"", status, Location=location)


def endless(chunk: bytes = b"\0" * 65536) -> Route:
    """A 200 with no Content-Length whose body never ends (until the client hangs up)."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.end_headers()
        with contextlib.suppress(OSError):  # until the client hangs up
            while True:
                handler.wfile.write(chunk)

    return route


def silent(seconds: float) -> Route:
    """Says nothing for ``seconds``, then a 404."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)
        body(b"late", 404)(handler)

    return route


@contextmanager
def image_server(routes: Mapping[str, Route]) -> Iterator[Served]:
    served = Served("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            served.requests.append((self.path, self.headers.get("Host", "")))
            route = routes.get(self.path, body(b"no such image", 404))
            with contextlib.suppress(OSError):  # the client hung up (a refused body)
                route(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    served.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(  # a short poll: shutdown() waits for the next one
        target=server.serve_forever,
        kwargs={"poll_interval": 0.02},
        name="image-server",
        daemon=True,
    )
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
