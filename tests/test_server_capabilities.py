"""A model that cannot do what a route asks answers 404 naming the model and what it lacks, on
every API's routes alike (#44): OpenAI answers 404 when a model does not serve an endpoint, and
the body is well formed (another model would answer it).

The server runs the embedded model's tokenizer and template over a ScriptRunner, told it is a
base model: it takes no chat turns (chat completions, Anthropic's Messages and count_tokens, the
Responses API), has no fill-in-the-middle tokens, and its runner computes no embeddings. Plain
text completions still answer: what the model lacks is refused, not the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from tests.test_server_scripted import ScriptedSession

MSG = [{"role": "user", "content": "Hi"}]
CHATS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2}),
    ("/v1/messages", {"messages": MSG, "max_tokens": 2}),
    ("/v1/messages/count_tokens", {"messages": MSG}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
]


@pytest.fixture(scope="module")
def base() -> Iterator[tuple[ScriptedSession, ServerThread]]:
    session = ScriptedSession(load_model(embedded_model_path()))
    session.base_model = True  # Session.render_chat refuses chat turns
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        yield session, server
    session.close()


def refusal(server: ServerThread, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The 404's message and the whole body, in the route's own error shape."""
    reply = httpx.post(server.url + path, json=body, timeout=60)
    assert reply.status_code == 404, (path, reply.text)
    error = reply.json()["error"]
    if path.startswith("/v1/messages"):
        assert reply.json()["type"] == "error" and error["type"] == "not_found_error"
    else:
        assert (error["param"], error["code"]) == ("model", "unsupported_model"), error
    return error["message"], reply.json()


@pytest.mark.parametrize(("path", "body"), CHATS, ids=[p for p, _ in CHATS])
def test_a_chat_of_a_base_model_is_a_404_on_every_api(
    base: tuple[ScriptedSession, ServerThread], path: str, body: dict[str, Any]
) -> None:
    session, server = base
    name = session.model.name
    message, _ = refusal(server, path, body)
    assert message.startswith(f"model '{name}' cannot chat: {name} is a base model"), message
    assert "/v1/completions" in message  # what to use instead


def test_fim_and_embeddings_the_model_lacks_are_404s(
    base: tuple[ScriptedSession, ServerThread],
) -> None:
    session, server = base
    name = session.model.name
    fim = {"prompt": "def f(", "suffix": ")", "max_tokens": 2}
    for path in ("/v1/completions", "/v1/fim/completions"):
        message, _ = refusal(server, path, fim)
        assert message.startswith(f"model '{name}' cannot fill in the middle: its vocabulary has")
    message, _ = refusal(server, "/v1/embeddings", {"input": "Hi"})
    assert message.startswith(f"model '{name}' cannot give embeddings: the "), message
    assert message.endswith("runner does not compute embeddings")


def test_what_the_model_has_still_answers(base: tuple[ScriptedSession, ServerThread]) -> None:
    session, server = base
    session.script(" there")
    body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"].startswith(" there")


def test_a_bad_parameter_is_still_a_400(base: tuple[ScriptedSession, ServerThread]) -> None:
    """Checked before the model's abilities: what is wrong whatever the model stays a 400."""
    _, server = base
    body = {"messages": MSG, "max_tokens": 0}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"


def test_the_document_declares_the_404(base: tuple[ScriptedSession, ServerThread]) -> None:
    _, server = base
    doc = httpx.get(server.url + "/openapi.json").json()
    others = ("/v1/completions", "/v1/fim/completions", "/v1/embeddings")
    for path in (*(p for p, _ in CHATS), *others):
        declared = doc["paths"][path]["post"]["responses"]["404"]
        assert "cannot do what is asked" in declared["description"], path
