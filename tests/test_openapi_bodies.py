"""The request bodies /openapi.json describes are the ones the server's body models take (#44):
each body here is checked against the document with a JSON Schema validator and sent to the
app, and the two verdicts agree: what the document calls valid passes validation (the app serves
no model, so it is then a 404), what it calls invalid is a 400.

Integers are JSON Schema's: ``1.0`` is one, on every API; strings, booleans and fractions are
not. The rules that tie fields together (tool_choice needs tools, echo or logprobs, a suffix
needs the prompt as text, tool_use blocks in assistant turns) are stated by the document too.
Rules no JSON Schema can state (a result must answer an earlier call, tool names unique, a
model's vocabulary) are tested where their handlers are."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from tests.test_openapi_doc import empty_app

MSG = [{"role": "user", "content": "x"}]
F = {"name": "f"}
TOOL = {"type": "function", "function": {**F, "parameters": {"type": "object"}}}
FLAT_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
TOOL_USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
BOOLEAN_PROPERTY = {"type": "object", "properties": {"x": True}}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object"}}

# (path, the body's fields besides the model, whether the document calls it valid)
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 1.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": "1"}, False),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": True}, False),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 1.5}, False),
    ("/v1/chat/completions", {"messages": MSG, "seed": -1.0, "top_k": 3.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "n": 1.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "n": 2}, False),
    ("/v1/chat/completions", {"messages": MSG, "logit_bias": {}}, True),
    ("/v1/chat/completions", {"messages": MSG, "logit_bias": {"1": 1.0}}, False),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["s"] * 16}, True),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["s"] * 17}, False),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 2.0}, True),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "sometimes"}, False),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "required"}, False),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "required", "tools": [TOOL]}, True),
    (
        "/v1/chat/completions",
        {"messages": MSG, "tools": [TOOL], "tool_choice": {"type": "function", "function": F}},
        True,
    ),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"function": {"name": "a b"}}]}, False),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}]}, False),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, False),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "yaml"}}, False),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema"}}, False),
    (
        "/v1/chat/completions",
        {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": None}},
        False,
    ),
    (  # a subschema may be a boolean, as JSON Schema has it
        "/v1/chat/completions",
        {"messages": MSG, "tools": [{"function": {**F, "parameters": BOOLEAN_PROPERTY}}]},
        True,
    ),
    ("/v1/completions", {"prompt": "x", "logprobs": 2.0, "best_of": 1.0}, True),
    ("/v1/completions", {"prompt": [1.0, 2.0]}, True),
    ("/v1/completions", {"prompt": "x", "best_of": 2}, False),
    ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1}, False),
    ("/v1/completions", {"prompt": [1, 2], "suffix": "y"}, False),
    ("/v1/completions", {"prompt": [""]}, False),
    ("/v1/completions", {"prompt": [""], "suffix": ""}, True),
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
    (
        "/v1/messages",
        {"messages": [{"role": "user", "content": [TOOL_USE]}], "max_tokens": 1},
        False,
    ),
    (
        "/v1/messages",
        {
            "messages": [
                *MSG,
                {"role": "assistant", "content": [{"type": "thinking"}, TOOL_USE]},
                {"role": "user", "content": [TOOL_RESULT]},
            ],
            "max_tokens": 1,
        },
        True,
    ),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [TOOL_USE]}]}, False),
    (
        "/v1/messages/count_tokens",
        {"messages": [{"role": "assistant", "content": [TOOL_RESULT]}]},
        False,
    ),
    (
        "/v1/messages/count_tokens",
        {"messages": [{"role": "user", "content": [{"type": "thinking"}]}]},
        False,
    ),
    ("/v1/messages/count_tokens", {"messages": MSG, "tools": [ANTHROPIC_TOOL]}, True),
    ("/v1/messages/count_tokens", {"messages": MSG, "tool_choice": {"type": "any"}}, False),
    ("/v1/responses", {"input": "x", "max_output_tokens": 4.0}, True),
    ("/v1/responses", {"input": "x", "tool_choice": "sometimes"}, False),
    ("/v1/responses", {"input": "x", "tool_choice": "required"}, False),
    (
        "/v1/responses",
        {"input": "x", "tools": [FLAT_TOOL], "tool_choice": {"type": "function", "name": "f"}},
        True,
    ),
    (
        "/v1/responses",
        {"input": "x", "tools": [FLAT_TOOL], "tool_choice": {"type": "allowed_tools"}},
        False,
    ),
    ("/v1/responses", {"input": []}, False),
    ("/v1/responses", {"input": [{"role": "developer", "content": "x"}]}, False),
    ("/v1/responses", {"input": [{"type": "reasoning"}, {"role": "user", "content": "x"}]}, True),
    ("/v1/responses", {"input": [{"type": "reasoning", "role": "user"}]}, False),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "yaml"}}}, False),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema"}}}, False),
    (
        "/v1/responses",
        {"input": "x", "text": {"format": {"type": "json_schema", "schema": None}}},
        False,
    ),
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
