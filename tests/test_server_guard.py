# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Who may talk to the server: the Host/Origin rule against DNS rebinding, an API key that cannot
be empty, and unknown routes that say what is served. Real requests against a real server."""

from __future__ import annotations

import httpx
import pytest

from localinfer.errors import InvalidParameterError
from localinfer.server import ServerThread, create_app
from localinfer.server.host_guard import HostPolicy
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures
    model_name,
    server,
    serving,
    session,
)

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def chat(srv: ServerThread, headers: dict[str, str], **kw: object) -> httpx.Response:
    return httpx.post(
        srv.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=120, **kw
    )


def assert_error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    return err["message"]


# -- DNS rebinding: Host ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example"])
def test_a_forged_host_gets_403_and_no_text(server: ServerThread, host: str) -> None:
    message = assert_error(chat(server, {"Host": host}), 403, "host_not_allowed")
    assert host.split(":")[0] in message and "--allowed-host" in message
    # Reading the model's state through a rebound name is refused as well.
    for path in ("/v1/models", "/health", "/metrics"):
        assert httpx.get(server.url + path, headers={"Host": host}).status_code == 403


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "localhost.", "192.168.1.20"]
)
def test_loopback_names_and_addresses_are_served(server: ServerThread, host: str) -> None:
    # An address cannot be rebound: only a name can point a web page's origin at this server.
    for value in (host, f"{host}:{server.port}"):
        r = chat(server, {"Host": value})
        assert r.status_code == 200, (value, r.text)
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_allowed_host_flag_adds_names(session: Session) -> None:
    with serving(session, allowed_hosts=["box.lan", ".corp.example"]) as srv:
        for host in ("box.lan", "box.lan:9", "corp.example", "gpu1.corp.example"):
            assert chat(srv, {"Host": host}).status_code == 200, host
        for host in ("evil.example", "box.lan.evil.example", "xcorp.example"):
            assert_error(chat(srv, {"Host": host}), 403, "host_not_allowed")


def test_allowed_host_star_turns_the_check_off(session: Session) -> None:
    with serving(session, allowed_hosts=["*"], api_key="k") as srv:
        headers = {"Host": "anything.example", "Origin": "http://anything.example"}
        r = chat(srv, {**headers, "Authorization": "Bearer k"})
        assert r.status_code == 200, r.text


def test_star_without_a_key_is_refused(session: Session) -> None:
    with pytest.raises(InvalidParameterError, match="--api-key"):
        HostPolicy.build(["*"], has_api_key=False)
    with pytest.raises(InvalidParameterError, match="--api-key"):
        create_app(session, allowed_hosts=["*"])


# -- DNS rebinding: Origin on requests that do something -------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "https://evil.example:443", "null"])
def test_a_foreign_origin_cannot_post(server: ServerThread, origin: str) -> None:
    message = assert_error(chat(server, {"Origin": origin}), 403, "origin_not_allowed")
    assert origin in message and "--cors-origin" in message


def test_a_foreign_origin_may_still_read_what_cors_allows(server: ServerThread) -> None:
    # GET changes nothing; whether a page may read the answer is CORS's business.
    r = httpx.get(server.url + "/health", headers={"Origin": "http://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize(
    "origin", ["http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8080"]
)
def test_local_origins_can_post(server: ServerThread, origin: str) -> None:
    assert chat(server, {"Origin": origin}).status_code == 200


def test_cors_origins_keep_working(session: Session) -> None:
    with serving(session, cors_origins=["https://app.example"]) as srv:
        r = chat(srv, {"Origin": "https://app.example"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert_error(chat(srv, {"Origin": "https://other.example"}), 403, "origin_not_allowed")
    with serving(session, cors_origins=["*"]) as srv:
        assert chat(srv, {"Origin": "https://other.example"}).status_code == 200
        # CORS opens origins, never hosts.
        assert_error(chat(srv, {"Host": "evil.example"}), 403, "host_not_allowed")


def test_refusals_are_counted(server: ServerThread) -> None:
    chat(server, {"Host": "evil.example"})
    metrics = httpx.get(server.url + "/metrics").text
    assert 'localinfer_http_errors_total{status="403",code="host_not_allowed"}' in metrics


# -- the API key cannot be empty --------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "   "])
def test_an_empty_api_key_is_refused(session: Session, key: str) -> None:
    with pytest.raises(InvalidParameterError, match="empty"):
        create_app(session, api_key=key)


# -- unknown routes say what is served ---------------------------------------------------------


def test_a_404_names_every_api_served(server: ServerThread) -> None:
    r = httpx.post(server.url + "/v1/audio/transcriptions", json={"model": "m"})
    message = assert_error(r, 404, "not_found")
    assert "POST /v1/audio/transcriptions" in message
    for route in (
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/fim/completions",
        "POST /v1/embeddings",
        "POST /v1/rerank",
        "POST /rerank",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "POST /v1/responses",
        "GET /health",
    ):
        assert route in message


def test_an_unknown_route_lists_the_routes(server: ServerThread) -> None:
    message = assert_error(httpx.get(server.url + "/v1/nothing"), 404, "not_found")
    assert "GET /v1/nothing" in message
    for route in ("GET /v1/models", "POST /v1/completions", "GET /metrics"):
        assert route in message
