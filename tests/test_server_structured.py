# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""``response_format`` through the real server on the embedded model, with the ``openai`` client.

The answers are checked by parsing them (``json``, pydantic via ``chat.completions.parse``) and
validating them with ``jsonschema``; a schema the engine cannot build is a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from localinfer.server import ServerThread
from tests.test_server_support import (  # noqa: F401 - fixtures
    client,
    model_name,
    server,
    session,
)

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "enum": ["France", "Japan", "Peru"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
    },
    "required": ["name", "country", "population_millions"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Paris as JSON."}]


class City(BaseModel):
    name: str = Field(max_length=20)
    country: Literal["France", "Japan", "Peru"]
    landmarks: list[str] = Field(max_length=2)


def schema_format(schema: dict, strict: bool = True) -> dict:
    wrapper = {"name": "city", "schema": schema, "strict": strict}
    return {"type": "json_schema", "json_schema": wrapper}


def test_json_schema_answer_validates(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=ASK,
        response_format=schema_format(CITY),
        max_tokens=120,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), CITY)


def test_json_object_answer_is_an_object(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
        seed=3,
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by max_tokens: still the start of an object, never prose
        assert choice.message.content.lstrip().startswith("{")


def test_parse_with_a_pydantic_model(client: openai.OpenAI, model_name: str) -> None:
    completion = client.chat.completions.parse(
        model=model_name, messages=ASK, response_format=City, max_tokens=150, temperature=0
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)


def test_streamed_schema_answer_validates(client: openai.OpenAI, model_name: str) -> None:
    stream = client.chat.completions.create(
        model=model_name,
        messages=ASK,
        response_format=schema_format(CITY, strict=False),
        max_tokens=120,
        temperature=0,
        stream=True,
    )
    parts, finish = [], None
    for chunk in stream:
        choice = chunk.choices[0]
        parts.append(choice.delta.content or "")
        finish = choice.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads("".join(parts)), CITY)


def test_text_completion_takes_response_format(client: openai.OpenAI, model_name: str) -> None:
    reply = client.completions.create(
        model=model_name,
        prompt="The capital of France, as JSON:",
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": schema_format(CITY)},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), CITY)


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}},
            "response_format.json_schema.schema",
        ),
        (
            schema_format({"type": "object", "properties": {"a": {"type": "nonsense"}}}),
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": CITY}},
            "response_format.json_schema.name",
        ),
    ],
)
def test_bad_response_format_is_a_400_naming_the_field(
    server: ServerThread, model_name: str, response_format: dict, param: str
) -> None:
    body = {"model": model_name, "messages": ASK, "response_format": response_format}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    # The body's model names the top-level field as param; later checks the whole path.
    assert param.startswith(error["param"]), error
    assert error["message"].startswith(param)
