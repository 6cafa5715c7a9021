"""Model ids are names first (#44): whatever string a request gives as its model, every route
that takes one answers 400 or 404 in its API's error shape, never a 5xx.

The server here runs `serve`'s own pool (ServeSupply, --models-from catalog and local) with the
embedded model loaded, in-process (no socket, no model run: every id below is refused before a
prompt is read). Ids that once reached path code and crashed: ``~`` with a user that does not
exist ("Could not determine home directory"), 300 characters ("File name too long"), NUL.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from localinfer.resolve import existing_path
from localinfer.server import create_app
from localinfer.server.model_ids import MAX_ID_CHARS, model_id_problem
from localinfer.server.model_loading import LoadSettings, ServeSupply, named_source
from localinfer.server.model_pool import ModelPool, PoolSettings

SETTINGS = LoadSettings(slots=1, ctx=256, models_from="catalog", options={"threads": 1})

# The ids the issue names, and a few relatives.
BAD_IDS = {
    "tilde-unknown-user": "~no-such-user-4f2a/model.gguf",
    "tilde-unassigned": "~\U000ea456",
    "300-chars": "a" * 300,
    "300-chars-in-a-path": "models/" + "b" * 300 + ".gguf",
    "nul": "smollm2\x00-135m",
    "dot-dot": "..",
    "dot-dot-path": "../../etc/passwd",
    "rtl-mark": "smollm2\u200f-135m",
    "rtl-override": "\u202emodel",
    "too-long": "c" * (MAX_ID_CHARS + 1),
}

MSG = [{"role": "user", "content": "Hi"}]
# (route, how the id travels): a path segment or the body's "model".
BODY_ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MSG, "max_tokens": 1},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 1},
    "/v1/fim/completions": {"prompt": "a", "suffix": "b", "max_tokens": 1},
    "/v1/embeddings": {"input": "Hi"},
    "/v1/messages": {"messages": MSG, "max_tokens": 1},
    "/v1/messages/count_tokens": {"messages": MSG},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 1},
}
PATH_ROUTES = {"GET {}": "", "POST {}/load": "/load", "POST {}/unload": "/unload"}
ROUTES = [*BODY_ROUTES, *PATH_ROUTES]


def _served(models_from: str) -> Iterator[TestClient]:
    settings = dataclasses.replace(SETTINGS, models_from=models_from)
    supply = ServeSupply(settings, ["embedded"])
    pool = ModelPool(supply, PoolSettings(keep_alive_s=None, wait_s=30))
    sources = [named_source(supply, "embedded")]
    app = create_app(pool=pool, start_up=lambda p: p.start(sources))
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 300  # only stops a broken start-up from hanging
        while client.get("/health").status_code == 503:
            assert time.monotonic() < deadline, "the embedded model did not load"
            time.sleep(0.05)
        assert client.get("/health").json()["status"] == "ok"
        yield client


@pytest.fixture(scope="module")
def catalog() -> Iterator[TestClient]:
    yield from _served("catalog")


@pytest.fixture(scope="module")
def local() -> Iterator[TestClient]:
    yield from _served("local")


def ask(client: TestClient, route: str, model_id: str) -> Any:
    if route in BODY_ROUTES:
        return client.post(route, json={**BODY_ROUTES[route], "model": model_id})
    method, _, _ = route.partition(" ")
    # Every character escaped, dots too: a client would otherwise resolve ".." itself.
    path = "/v1/models/" + quote(model_id, safe="").replace(".", "%2E") + PATH_ROUTES[route]
    return client.request(method, path)


def assert_clean_refusal(reply: Any, route: str) -> None:
    assert reply.status_code in (400, 404), (route, reply.status_code, reply.text[:300])
    body = reply.json()
    if route.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["message"]
    else:
        assert body["error"]["message"] and body["error"]["param"] in ("model", "model_id")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", list(BAD_IDS))
def test_any_model_id_is_a_400_or_404(catalog: TestClient, route: str, name: str) -> None:
    assert_clean_refusal(ask(catalog, route, BAD_IDS[name]), route)


@pytest.mark.parametrize("name", ["tilde-unknown-user", "300-chars", "nul", "rtl-mark"])
def test_with_local_paths_allowed_too(local: TestClient, name: str) -> None:
    """--models-from local lets ids reach path code; the same ids are still clean refusals."""
    for route in ("/v1/chat/completions", "POST {}/load"):
        assert_clean_refusal(ask(local, route, BAD_IDS[name]), route)


def test_invisible_and_control_characters_are_a_400_naming_the_character(
    catalog: TestClient,
) -> None:
    for route in ("/v1/chat/completions", "GET {}", "POST {}/unload"):
        reply = ask(catalog, route, BAD_IDS["rtl-mark"])
        assert reply.status_code == 400, reply.text
        assert "U+200F" in reply.json()["error"]["message"]
    reply = ask(catalog, "/v1/messages", BAD_IDS["nul"])
    assert reply.status_code == 400 and "U+0000" in reply.json()["error"]["message"]


def test_names_no_path_can_be_are_not_served(catalog: TestClient) -> None:
    for name in ("tilde-unknown-user", "300-chars", "dot-dot"):
        reply = ask(catalog, "/v1/chat/completions", BAD_IDS[name])
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"]["code"] == "model_not_found"


def test_served_names_still_answer(catalog: TestClient) -> None:
    assert catalog.get("/v1/models/smollm2-135m").json()["state"] == "loaded"
    assert catalog.get("/v1/models/embedded").json()["id"] == "smollm2-135m"
    reply = catalog.post("/v1/messages/count_tokens", json={"model": "embedded", "messages": MSG})
    assert reply.status_code == 200 and reply.json()["input_tokens"] > 0


def test_the_rules_without_a_server() -> None:
    assert model_id_problem("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M") is None
    assert model_id_problem("~/models/x.gguf") is None  # a plausible path: resolution decides
    assert "U+200F" in (model_id_problem("a\u200fb") or "")
    assert "characters" in (model_id_problem("x" * (MAX_ID_CHARS + 1)) or "")
    for spec in (BAD_IDS["tilde-unknown-user"], "d" * 300, "a\x00b", "~\U000ea456"):
        assert existing_path(spec) is None
    assert existing_path(".") is not None
    supply = ServeSupply(SETTINGS)
    for spec in BAD_IDS.values():
        assert supply.find(spec) is None, spec
