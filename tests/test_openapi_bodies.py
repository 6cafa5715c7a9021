"""The request bodies /openapi.json describes are the ones the server's body models take (#44):
each body here is checked against the document with a JSON Schema validator and sent to the
app, and the two verdicts agree: what the document calls valid passes validation (the app serves
no model, so it is then a 404), what it calls invalid is a 400.

Integers are JSON Schema's: ``1.0`` is one, on every API; strings, booleans and fractions are
not."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from tests.test_openapi_doc import empty_app

MSG = [{"role": "user", "content": "x"}]

# (path, the body's fields besides the model, whether the document calls it valid)
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 1.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": "1"}, False),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": True}, False),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 1.5}, False),
    ("/v1/chat/completions", {"messages": MSG, "seed": -1.0, "top_k": 3.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "n": 1.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 2.0}, True),
    ("/v1/completions", {"prompt": "x", "logprobs": 2.0, "best_of": 1.0}, True),
    ("/v1/completions", {"prompt": [1.0, 2.0]}, True),
    (
        "/v1/fim/completions",
        {"prompt": "x", "max_completion_tokens": 4.0, "random_seed": 1.0},
        True,
    ),
    ("/v1/embeddings", {"input": [1.0, 2.0], "dimensions": 64.0}, True),
    ("/v1/embeddings", {"input": [1.5]}, False),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, False),
    ("/v1/messages", {"messages": MSG, "max_tokens": 8.0, "top_k": 2.0}, True),
    ("/v1/messages", {"messages": MSG, "max_tokens": "8"}, False),
    ("/v1/responses", {"input": "x", "max_output_tokens": 4.0}, True),
]


@pytest.fixture(scope="module")
def app() -> Any:
    return empty_app()


def documented_valid(doc: dict[str, Any], path: str, body: dict[str, Any]) -> bool:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    # The document is the root, so the body schema's $refs resolve within it.
    schema = {"components": doc["components"], **ref}
    return jsonschema.Draft202012Validator(schema).is_valid(body)


@pytest.mark.parametrize(("path", "fields", "valid"), CASES)
def test_the_document_and_the_body_models_agree(
    app: Any, path: str, fields: dict[str, Any], valid: bool
) -> None:
    body = {"model": "nothing", **fields}
    assert documented_valid(app.openapi(), path, body) is valid
    reply = TestClient(app, base_url="http://localhost").post(path, json=body)
    assert reply.status_code == (404 if valid else 400), reply.text
