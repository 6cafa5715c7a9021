"""The connection half of the request limits: uvicorn's h11 protocol with a deadline for each
request head and an OpenAI-JSON answer to a head that is too large or malformed.

uvicorn arms no timer while a head arrives (its keep-alive timer stops at the first byte), so a
client that sends half a head, or a byte now and then, holds a connection for ever. Here a
timer runs from the connection's start (and from the end of each answer) until a whole head has
arrived; when it fires, the client gets a 408 and the connection closes. The same timer bounds
how long the rest of a refused body (a 413 sent early) may take to drain.

A head over ``max_header_bytes`` gets a 431 instead of uvicorn's plain-text 400, and the
connection closes *lingering*: closing a socket with unread input makes the kernel send a reset
that can destroy the answer before the client reads it, so this side shuts its half, drops what
still arrives for a moment, then closes.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from localinfer.engine.arrivals import ARRIVAL, Arrival, Arrivals
from localinfer.server.errors import error_body
from localinfer.server.limits import RequestLimits
from localinfer.server.raw_body import RAW_BODY, ChunkedBodyWriter

# How long a refused client may go on sending before the connection is closed regardless.
LINGER_S = 2.0


def raw_error(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response with OpenAI's JSON body, for moments when h11's state
    (no request parsed, or a broken one) does not allow sending a response through it."""
    body = json.dumps(error_body(status, message, code=code)).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def settle_arrival(scope: Mapping[str, Any]) -> None:
    """The request of ``scope`` is read and handed to an engine: no engine waits for it any more
    (engine/arrivals.py)."""
    arrival = scope.get("extensions", {}).get(ARRIVAL)
    if arrival is not None:
        arrival.settle()


class LimitedH11Protocol(H11Protocol):
    def __init__(
        self, *args: Any, limits: RequestLimits, arrivals: Arrivals | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._arrivals = arrivals  # requests being read, for the engines (engine/arrivals.py)
        self._arrival: Arrival | None = None

    @classmethod
    def factory(
        cls, limits: RequestLimits, arrivals: Arrivals | None = None
    ) -> Callable[..., LimitedH11Protocol]:
        """What uvicorn's ``Config(http=...)`` takes: a protocol class, or a callable like it."""
        return functools.partial(cls, limits=limits, arrivals=arrivals)

    # -- the head deadline ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a whole head arrived: a request is being served
            self._disarm_head_timer()
            # Before its app task first runs (it is only scheduled): streams write their body
            # chunks through this (raw_body.py).
            extensions = self.cycle.scope.setdefault("extensions", {})
            extensions[RAW_BODY] = ChunkedBodyWriter(self.cycle)
            if self._arrivals is not None:  # counted until it reaches an engine or is answered
                self._settle_arrival()
                self._arrival = extensions[ARRIVAL] = self._arrivals.arrive()

    def on_response_complete(self) -> None:
        self._settle_arrival()
        # Armed first: the call below may start a pipelined request, which disarms it.
        self._arm_head_timer()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle_arrival()
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _settle_arrival(self) -> None:
        if self._arrival is not None:
            self._arrival.settle()
            self._arrival = None

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self._limits.header_timeout_s, self._head_late)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or (self.cycle and not self.cycle.response_complete):
            return
        waiting_for_head = self.conn.our_state is h11.IDLE
        partial = self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0])
        if waiting_for_head and partial:
            message = (
                f"the request head did not arrive within {self._limits.header_timeout_s:g} s "
                "(the server's --header-timeout)"
            )
            self.transport.write(raw_error(408, message, "request_timeout"))
        # A silent connection, or the unread rest of a refused body: just close.
        self.transport.close()

    # -- a head too large or malformed --------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # a refused client still sending: dropped
        super().data_received(data)

    def eof_received(self) -> bool | None:
        if self._lingering:
            self.transport.close()
        return super().eof_received()

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn when h11 cannot parse what the client sent."""
        if self.cycle is not None and not self.cycle.response_complete:
            # A body broke mid-request (bad chunked encoding): the handler owns the response.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self.transport.close()
            return
        limit = self._limits.max_header_bytes
        if len(self.conn.trailing_data[0]) > limit:
            status, code = 431, "request_header_too_large"
            message = (
                f"the request line and headers are over the limit of {limit} bytes "
                "(the server's --max-header-size)"
            )
        else:
            status, code, message = 400, "invalid_http_request", "invalid HTTP request"
        self._disarm_head_timer()
        self.transport.write(raw_error(status, message, code))
        self._linger()

    def _linger(self) -> None:
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
