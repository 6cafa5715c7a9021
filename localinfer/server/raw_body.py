"""A streamed response's body chunks written straight to the connection, past the ASGI send chain.

Every SSE chunk of a stream (a token each) used to pass three middleware send wrappers and
uvicorn's h11 send, which builds an ``h11.Data`` event, runs it through h11's state machine and
writes the chunk's framing piece by piece: Python on the event loop for each token, on the same
cores as the compute threads. Once a response has started with chunked framing, a body chunk is
nothing but ``size CRLF data CRLF`` and changes no state in h11 (Data keeps a response in
SEND_BODY), so :class:`ChunkedBodyWriter` writes exactly those bytes to the transport, minding
the same flow control and disconnect as uvicorn's send. The start and the end of the response
still go through ``send`` (the middlewares see the start; h11 writes the last chunk and moves
on to the next request).

``LimitedH11Protocol`` puts a writer in each request's scope under ``RAW_BODY``
(``scope["extensions"]``); a response without it (another server, the test client) sends as
before, and so does one whose framing is not chunked (an HTTP/1.0 client, a HEAD request).
"""

from __future__ import annotations

from typing import Any

import h11

RAW_BODY = "localinfer.raw_body"


def _chunked_writer_type() -> type | None:
    try:
        from h11._writers import ChunkedWriter
    except ImportError:  # a future h11 moved it: every chunk goes through send
        return None
    return ChunkedWriter


CHUNKED = _chunked_writer_type()


class ChunkedBodyWriter:
    """Writes body chunks of one request's response (uvicorn's h11 ``RequestResponseCycle``)."""

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle

    def ready(self) -> bool:
        """Whether a body chunk can be written here: the response started with chunked framing
        and is not complete. Otherwise the caller sends it through ASGI."""
        cycle = self._cycle
        conn = cycle.conn
        return (
            CHUNKED is not None
            and cycle.response_started
            and not cycle.response_complete
            and conn.our_state is h11.SEND_BODY
            and type(getattr(conn, "_writer", None)) is CHUNKED
        )

    async def write(self, data: bytes) -> None:
        """One body chunk, as uvicorn's send would write it (nothing for an empty one)."""
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected or not data:
            return
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
