"""/openapi.json tells what the server does (#44): the statuses each route answers with the error
body it really sends, no 422 (validation failures are 400s), the constraints the body models
enforce, the content types it sends, and 405s that offer the methods a path has.

No model is loaded: the document and the refusals checked here come before any."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from localinfer.server import create_app
from localinfer.server.model_pool import ModelPool, PoolSettings
from localinfer.server.state import _HandedSupply

MODEL_ROUTES = ("/v1/models/{model_id}", "/v1/models/{model_id}/load")
ANSWER_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/fim/completions")


def empty_app(**options: Any) -> Any:
    """The app with nothing served (every model id is a 404)."""
    return create_app(pool=ModelPool(_HandedSupply(), PoolSettings()), **options)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return empty_app().openapi()


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(p, m, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def schema_of(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    return doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def test_no_422_and_every_error_has_the_body_schema(doc: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, method, op in operations(doc):
        assert "422" not in op["responses"], (method, path)
        assert "403" in op["responses"]  # the Host guard is on by default
        for status, response in op["responses"].items():
            if status.startswith("4"):
                ref = response["content"]["application/json"]["schema"]["$ref"]
                want = (
                    "AnthropicErrorBody" if path.startswith("/v1/messages") else "OpenAIErrorBody"
                )
                assert ref.endswith("/" + want), (path, status)


def test_routes_declare_what_their_handling_answers(doc: dict[str, Any]) -> None:
    for path in (*ANSWER_ROUTES, "/v1/embeddings", "/v1/messages", "/v1/responses"):
        assert {"400", "404", "408", "413", "503", "507"} <= set(
            doc["paths"][path]["post"]["responses"]
        )
        streamed = doc["paths"][path]["post"]["responses"]["200"]["content"]
    assert (
        "text/event-stream"
        in doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    )
    assert {"400", "404", "409", "503"} <= set(
        doc["paths"]["/v1/models/{model_id}/unload"]["post"]["responses"]
    )
    assert {"400", "404", "503"} <= set(doc["paths"]["/v1/models/{model_id}"]["get"]["responses"])
    assert set(doc["paths"]["/health"]["get"]["responses"]) >= {"200", "500", "503"}
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert "401" not in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert streamed  # every answer route documents its stream too


def test_the_api_key_is_documented_where_it_applies() -> None:
    doc = empty_app(api_key="k").openapi()
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert "401" in doc["paths"]["/v1/models"]["get"]["responses"]
    assert "security" in doc["paths"]["/v1/models"]["get"]
    assert "401" not in doc["paths"]["/health"]["get"]["responses"]


def test_refusals_match_the_documented_error_schema(doc: dict[str, Any]) -> None:
    client = TestClient(empty_app(), base_url="http://localhost")
    cases = [
        ("post", "/v1/chat/completions", {"messages": []}, 400),
        ("post", "/v1/completions", {"prompt": "x", "model": "nothing"}, 404),
        ("get", "/v1/models/nothing", None, 404),
        ("post", "/v1/messages", {"messages": [], "max_tokens": 1}, 400),
        ("post", "/v1/embeddings", {"input": "x", "dimensions": 0}, 400),
    ]
    for method, path, body, status in cases:
        reply = client.request(method.upper(), path, json=body)
        assert reply.status_code == status, (path, reply.text)
        documented = path if path in doc["paths"] else "/v1/models/{model_id}"
        ref = doc["paths"][documented][method]["responses"][str(status)]["content"]
        # The document is the root, so the error body's $refs resolve within it.
        schema = {"components": doc["components"], **ref["application/json"]["schema"]}
        jsonschema.Draft202012Validator(schema).validate(reply.json())


def body_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return schema_of(doc, ref["$ref"])


def test_the_bodies_state_the_constraints_the_handlers_enforce(doc: dict[str, Any]) -> None:
    chat = body_schema(doc, "/v1/chat/completions")
    assert chat["then"]["properties"]["logprobs"] == {"const": True}  # top_logprobs needs it
    messages = chat["properties"]["messages"]["items"]
    assert set(messages["discriminator"]["mapping"]) >= {"user", "tool", "assistant"}
    tool_message = schema_of(doc, messages["discriminator"]["mapping"]["tool"])
    assert "content" in tool_message["required"]
    completion = body_schema(doc, "/v1/completions")
    empty = {"type": "string", "maxLength": 0}
    assert empty in completion["if"]["properties"]["prompt"]["anyOf"]  # "" and [""]
    assert completion["then"]["required"] == ["suffix"]
    embeddings = body_schema(doc, "/v1/embeddings")
    forms = embeddings["properties"]["input"]["anyOf"]
    assert {"type": "string", "minLength": 1} in forms
    assert embeddings["properties"]["dimensions"]["anyOf"][0]["minimum"] == 1
    model = chat["properties"]["model"]["anyOf"][0]
    assert model["maxLength"] == 1024 and "\\u200f" in model["pattern"]
    responses = body_schema(doc, "/v1/responses")
    assert responses["properties"]["store"]["anyOf"][0]["const"] is False
    assert responses["properties"]["temperature"]["anyOf"][0]["type"] == "number"


def test_the_model_validators_match_the_document(doc: dict[str, Any]) -> None:
    """Bodies the document calls invalid are 400s, with the field named."""
    client = TestClient(empty_app(), base_url="http://localhost")
    msg = [{"role": "user", "content": "x"}]
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "tool"}]}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": msg, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": msg, "temperature": "0.5"}, "temperature"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": [""]}, "prompt"),
        ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
        ("/v1/responses", {"input": "x", "store": True}, "store"),
        ("/v1/responses", {"input": "x", "prompt": {"id": "p"}}, "prompt"),
        ("/v1/chat/completions", {"messages": msg, "model": "a\u202eb"}, "model"),
    ]
    for path, body, param in cases:
        reply = client.post(path, json=body)
        assert reply.status_code == 400, (path, body, reply.text)
        assert reply.json()["error"]["param"] == param, reply.text
    anthropic = client.post(
        "/v1/messages/count_tokens", json={"messages": msg, "tool_choice": {"type": "tool"}}
    )
    assert anthropic.status_code == 400 and "needs the name" in anthropic.json()["error"]["message"]


def test_405_offers_the_methods_of_the_path() -> None:
    client = TestClient(empty_app(), base_url="http://localhost")
    for path in ("/v1/models/0/load", "/v1/models/org/name/unload"):
        for method in ("OPTIONS", "GET", "PUT"):
            reply = client.request(method, path)
            assert reply.status_code == 405, (method, path, reply.text)
            assert reply.headers["allow"] == "POST"
    reply = client.request("DELETE", "/v1/models/org/name")
    assert reply.status_code == 405 and "GET" in reply.headers["allow"]
    assert client.get("/v1/models/org/name").status_code == 404  # an id with a slash
