# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Streamed body chunks written straight to the connection (server/raw_body.py) put the same bytes
on the wire as uvicorn's h11 send, parse as chunked HTTP, and give way to send wherever the
framing is not chunked or the response is not under way."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from types import SimpleNamespace

import h11
import pytest

from localinfer.server import ServerThread
from localinfer.server.raw_body import ChunkedBodyWriter
from localinfer.session import Session
from tests.test_server_support import server, session, wait_idle  # noqa: F401 - fixtures

BODY = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 24,
        "temperature": 0, "stream": True}  # fmt: skip


def raw_exchange(srv: ServerThread, version: str = "1.1") -> bytes:
    """The server's whole answer to one streamed completion, as bytes off the socket."""
    host, port = srv.url.split("//")[1].rsplit(":", 1)
    body = json.dumps(BODY).encode()
    head = (f"POST /v1/completions HTTP/{version}\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head + body)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def same_but_ids(data: bytes) -> bytes:
    """The answer with what differs between two requests (id, creation time, date, timings)
    made equal, and chunk sizes dropped (an id's length does not change, but timings do)."""
    data = re.sub(rb'"(id|created)":("[^"]*"|\d+)', rb'"\1":_', data)
    data = re.sub(rb'"timings":\{[^}]*\}', b'"timings":_', data)
    data = re.sub(rb"date: [^\r]*\r\n", b"", data)
    return re.sub(rb"\r\n[0-9a-f]+\r\n", b"\r\n_\r\n", data)


def chunks_of(data: bytes) -> list[bytes]:
    """The body's Data events as an h11 client reads them (fails on bad framing)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")])
    )
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    got: list[bytes] = []
    while (event := conn.next_event()) is not h11.NEED_DATA:
        if isinstance(event, h11.Data):
            got.append(bytes(event.data))
        if isinstance(event, h11.EndOfMessage):
            return got
    raise AssertionError("the answer did not end")


def test_the_wire_bytes_are_those_of_h11s_send(
    server: ServerThread, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[int] = []
    original = ChunkedBodyWriter.write

    async def counting(self: ChunkedBodyWriter, data: bytes) -> None:
        written.append(len(data))
        await original(self, data)

    monkeypatch.setattr(ChunkedBodyWriter, "write", counting)
    fast = raw_exchange(server)
    wait_idle(session)
    assert len(written) >= 24  # the tokens' chunks went the direct way
    monkeypatch.setattr(ChunkedBodyWriter, "ready", lambda self: False)
    slow = raw_exchange(server)
    wait_idle(session)
    assert b"transfer-encoding: chunked" in fast.lower()
    assert same_but_ids(fast) == same_but_ids(slow)
    events = b"".join(chunks_of(fast))
    assert events.count(b"data: ") == 24 + 2 and events.endswith(b"data: [DONE]\n\n")


def test_an_http10_client_gets_the_close_delimited_body_through_send(
    server: ServerThread, session: Session
) -> None:
    out = raw_exchange(server, version="1.0")
    wait_idle(session)
    assert b"transfer-encoding" not in out.lower()
    assert out.count(b"data: ") == 24 + 2 and out.endswith(b"data: [DONE]\n\n")


class _Flow:
    def __init__(self, paused: bool) -> None:
        self.write_paused = paused
        self.drained = 0

    async def drain(self) -> None:
        self.drained += 1
        self.write_paused = False


def _cycle(**kw: object) -> SimpleNamespace:
    base = {"flow": _Flow(False), "disconnected": False, "transport": SimpleNamespace(
        writes=[], write=None)}  # fmt: skip
    cycle = SimpleNamespace(**{**base, **kw})
    cycle.transport.write = cycle.transport.writes.append
    return cycle


def test_a_paused_connection_is_drained_first_and_a_gone_one_gets_nothing() -> None:
    paused = _cycle(flow=_Flow(True))
    asyncio.run(ChunkedBodyWriter(paused).write(b"data: x\n\n"))
    assert paused.flow.drained == 1 and paused.transport.writes == [b"9\r\ndata: x\n\n\r\n"]
    gone = _cycle(disconnected=True)
    asyncio.run(ChunkedBodyWriter(gone).write(b"abc"))
    assert gone.transport.writes == []
    empty = _cycle()
    asyncio.run(ChunkedBodyWriter(empty).write(b""))  # h11 writes nothing for an empty chunk
    assert empty.transport.writes == []


def test_not_ready_before_the_start_or_after_the_end() -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.next_event(), conn.next_event()
    cycle = SimpleNamespace(conn=conn, response_started=False, response_complete=False)
    writer = ChunkedBodyWriter(cycle)
    assert not writer.ready()
    conn.send(h11.Response(status_code=200, headers=[]))  # no length: chunked for a 1.1 client
    cycle.response_started = True
    assert writer.ready()
    conn.send(h11.EndOfMessage())
    cycle.response_complete = True
    assert not writer.ready()
