"""Running the app under uvicorn: in this thread (``localinfer serve``) or in a background thread
(tests and benchmarks, which need a real socket for real clients)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from localinfer.server.limits import RequestLimits
from localinfer.server.protocol import LimitedH11Protocol

# In-flight streams get this long to finish on shutdown before they are cut.
GRACEFUL_SHUTDOWN_S = 5


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    limits: RequestLimits | None = None,
) -> uvicorn.Config:
    """``limits`` default to the ones ``create_app`` gave the app, so the connection and the app
    enforce the same numbers."""
    app_state = getattr(app, "state", None)
    if limits is None:
        limits = getattr(app_state, "request_limits", None) or RequestLimits()
    arrivals = getattr(app_state, "arrivals", None)  # the app's count of requests being read
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # One process, one event loop: the engine thread is the only model owner.
        workers=None,
        access_log=log_level == "debug",
        # Always h11 (never httptools, if installed): the head limits live in this protocol.
        http=LimitedH11Protocol.factory(limits, arrivals),
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread.

    with ServerThread(create_app(session)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))  # port 0: the OS picks a free one, no race
        self.host, self.port = self._socket.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn_config(app, host, self.port, log_level="warning"))
        self._thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [self._socket]},
            daemon=True,
            name="localinfer-uvicorn",
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start in time")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
