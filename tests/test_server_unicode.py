# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Text a client sends that is not valid Unicode (a lone UTF-16 surrogate, which JSON lets a
body spell as "\\ud800") never turns into a 500 when the server writes it back: in an error
message (an unknown model's name) or in a Responses object that echoes the request; and a body
the JSON parser gives up on still gets a 400 with an error code."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from localinfer.server import ServerThread
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures
    server,
    session,
    wait_idle,
)

LONE = "\udc00"  # json.dumps writes it as the escape "\udc00", as a client's encoder would
MSG = [{"role": "user", "content": "Hi"}]

# (path, body): each echoes LONE somewhere in its answer.
ECHOING: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": LONE, "messages": MSG, "max_tokens": 1}),
    ("/v1/completions", {"model": LONE, "prompt": "Hi", "max_tokens": 1}),
    ("/v1/embeddings", {"model": LONE, "input": "Hi"}),
    ("/v1/messages", {"model": LONE, "messages": MSG, "max_tokens": 1}),
    ("/v1/messages/count_tokens", {"model": LONE, "messages": MSG}),
    ("/v1/responses", {"model": LONE, "input": "Hi", "max_output_tokens": 1}),
    ("/v1/responses", {"input": "Hi", "instructions": LONE, "max_output_tokens": 1}),
    (
        "/v1/responses",
        {
            "input": "Hi",
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "description": LONE,
                    "parameters": {"type": "object"},
                }
            ],
            "max_output_tokens": 1,
        },
    ),
    ("/v1/responses", {"input": "Hi", "text": {"verbosity": LONE}, "max_output_tokens": 1}),
]


@pytest.mark.parametrize(("path", "body"), ECHOING, ids=[f"{p} {sorted(b)}" for p, b in ECHOING])
def test_lone_surrogates_echoed_back_are_never_a_500(
    server: ServerThread, session: Session, path: str, body: dict[str, Any]
) -> None:
    raw = json.dumps(body).encode()
    assert b"\\udc00" in raw  # the escape, as sent on the wire
    r = httpx.post(
        server.url + path,
        content=raw,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert r.status_code < 500, (r.status_code, r.text)
    answer = r.json()  # valid JSON, the surrogate escaped as it came in
    assert LONE in json.dumps(answer, ensure_ascii=False)
    wait_idle(session)


def test_a_body_json_cannot_parse_is_a_400_with_a_code(server: ServerThread) -> None:
    """Nesting deeper than Python's JSON parser goes is not a JSONDecodeError, so FastAPI
    answers it with a bare 400; it still carries a code (and the metrics a label)."""
    depth = 100_000
    raw = b'{"messages": [{"role": "user", "content": "Hi"}], "metadata": '
    raw += b"[" * depth + b"]" * depth + b"}"
    for path in ("/v1/chat/completions", "/v1/messages"):
        r = httpx.post(
            server.url + path,
            content=raw,
            headers={"Content-Type": "application/json"},
            timeout=120,
        )
        assert r.status_code == 400, r.text
        if path == "/v1/messages":
            assert r.json()["error"]["type"] == "invalid_request_error"
        else:
            assert r.json()["error"]["code"] == "invalid_request"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'code=""' not in metrics
