# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Limits on what a client can send: body size, a deadline for the request head and for the body,
and a head too large. Raw sockets against a real server on 127.0.0.1; the deadlines are set short
so the tests are quick, and the tests assert what the server does, never how long it took."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from localinfer.server import ServerThread
from localinfer.server.limits import RequestLimits
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures
    server,
    serving,
    session,
)

LIMITS = RequestLimits(
    max_body_bytes=64 * 1024,
    max_header_bytes=16 * 1024,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
)
# How long a test waits for the server to act before calling the connection "still held"; only
# a guard against a hanging test, far above the deadlines under test.
PATIENCE_S = 30


@pytest.fixture(scope="module")
def limited(session: Session) -> Iterator[ServerThread]:
    with serving(session, limits=LIMITS) as srv:
        yield srv


def connect(srv: ServerThread) -> socket.socket:
    sock = socket.create_connection((srv.host, srv.port))
    sock.settimeout(PATIENCE_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout here means the
    server kept holding it)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        raise AssertionError(
            f"the server still holds the connection after {PATIENCE_S} s"
        ) from None
    finally:
        sock.close()
    return b"".join(chunks)


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return status, headers, body


def assert_error_json(body: bytes, code: str) -> str:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err["message"]


def head(path: str = "/v1/completions", **headers: str | int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- body size -----------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413(limited: ServerThread) -> None:
    body = {"prompt": "x" * (100 * 1024), "max_tokens": 1}
    r = httpx.post(limited.url + "/v1/completions", json=body, timeout=PATIENCE_S)
    assert r.status_code == 413
    message = assert_error_json(r.content, "request_too_large")
    assert "65536 bytes" in message and "--max-body-size" in message


def test_a_chunked_body_over_the_limit_is_413(limited: ServerThread) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(8):
            yield b"x" * 16384
        yield b'"}'

    r = httpx.post(
        limited.url + "/v1/completions",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=PATIENCE_S,
    )
    assert r.status_code == 413
    assert_error_json(r.content, "request_too_large")


def test_the_default_limit_refuses_a_huge_body(server: ServerThread) -> None:
    # Not a valid request either, so before the limit existed it was read whole and got a 400.
    body = json.dumps({"messages": "x" * (9 * 1024 * 1024)}).encode()
    r = httpx.post(
        server.url + "/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=PATIENCE_S,
    )
    assert r.status_code == 413, r.text
    assert_error_json(r.content, "request_too_large")


def test_a_body_under_the_limit_is_served(limited: ServerThread) -> None:
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    r = httpx.post(limited.url + "/v1/completions", json=body, timeout=PATIENCE_S)
    assert r.status_code == 200, r.text


# -- deadlines -------------------------------------------------------------------------------------


def assert_stalled_requests_get_408(srv: ServerThread, start: bytes, option: str) -> None:
    """Twenty connections each send ``start`` of a request and stall: each gets a 408 that names
    the ``option`` setting the deadline, and is closed."""
    socks = [connect(srv) for _ in range(20)]
    for sock in socks:
        sock.sendall(start)
    for sock in socks:
        status, headers, body = parse(read_until_closed(sock))
        assert status == 408 and headers["connection"] == "close"
        assert option in assert_error_json(body, "request_timeout")


def test_stalled_bodies_get_408_and_are_closed(limited: ServerThread) -> None:
    start = head(Content_Length=1000) + b'{"prompt": '
    assert_stalled_requests_get_408(limited, start, "--body-timeout")


def test_half_sent_heads_get_408_and_are_closed(limited: ServerThread) -> None:
    start = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
    assert_stalled_requests_get_408(limited, start, "--header-timeout")


def test_silent_connections_are_closed(limited: ServerThread) -> None:
    socks = [connect(limited) for _ in range(5)]
    for sock in socks:
        assert read_until_closed(sock) == b""


def test_a_trickled_head_is_cut_at_the_deadline(limited: ServerThread) -> None:
    # A byte now and then must not keep the connection: the deadline is for the whole head.
    sock = connect(limited)
    sock.settimeout(0.05)  # the pace of the trickle, not a measurement
    answer = None
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
        for _ in range(int(PATIENCE_S / 0.05)):
            sock.sendall(b"a")
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                continue
    except (BrokenPipeError, ConnectionResetError):
        answer = b""
    finally:
        sock.close()
    assert answer is not None, "the server kept reading a trickled head"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")


def test_the_deadlines_do_not_limit_a_long_answer(limited: ServerThread) -> None:
    body = {
        "prompt": "Once",
        "max_tokens": 24,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", limited.url + "/v1/completions", json=body, timeout=PATIENCE_S) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        # Outlast both deadlines mid-answer (a pause, not a measurement).
        time.sleep(3 * max(LIMITS.header_timeout_s, LIMITS.body_timeout_s))
        data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert json.loads(data[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"


def test_a_connection_stays_usable_between_requests(limited: ServerThread) -> None:
    with httpx.Client(base_url=limited.url, timeout=PATIENCE_S) as client:
        for _ in range(3):
            assert client.get("/health").status_code == 200


# -- head size -------------------------------------------------------------------------------------


def test_a_huge_header_gets_431_not_a_reset(limited: ServerThread) -> None:
    sock = connect(limited)
    sock.sendall(head(X_Big="a" * 200_000))
    status, headers, body = parse(read_until_closed(sock))
    assert status == 431 and headers["connection"] == "close"
    message = assert_error_json(body, "request_header_too_large")
    assert "16384 bytes" in message and "--max-header-size" in message


def test_a_malformed_request_gets_400_json(limited: ServerThread) -> None:
    sock = connect(limited)
    sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    status, _, body = parse(read_until_closed(sock))
    assert status == 400
    assert_error_json(body, "invalid_http_request")


def test_the_server_still_serves_after_all_that(limited: ServerThread) -> None:
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    assert httpx.post(limited.url + "/v1/completions", json=body, timeout=60).status_code == 200
