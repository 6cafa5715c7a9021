# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""OpenAI's Responses API (``/v1/responses``) through a real server on the embedded model,
driven by the official ``openai`` client: ``responses.create`` whole and streamed,
``responses.stream`` and ``responses.parse``, tools, a function-call round trip, and the
refusals (stored state, built-in tools) as 400s naming the field.

Every body is also checked against the SDK's own pydantic types (``Response`` and the stream
event union), so a field the SDK requires but ignores when reading cannot go missing unseen.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from localinfer.engine.types import Request, SamplingParams
from localinfer.server import ServerThread
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures
    SHORT,
    client,
    model_name,
    server,
    session,
)
from tests.test_server_tools import PARAMS, TOOLS, check_call

EVENTS = TypeAdapter(ResponseStreamEvent)
# Answers the model ends by itself (greedy): 12 tokens, and 7 with the system prompt.
QUESTION = "What is 2+2?"
SYSTEM = "Answer in one short sentence."
ROOM = 32
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
WEATHER_ASK = "What is the weather in Paris?"


def engine_answer(session: Session, messages: list[dict], max_tokens: int):
    """The engine's own greedy answer to ``messages`` (no server)."""
    ids = session.chat_prompt_ids(messages)
    return ids, session.engine.generate(
        Request(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    )


def post(server: ServerThread, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json=body, timeout=120)


def raw_events(server: ServerThread, body: dict) -> list[dict]:
    """The stream's events; each ``event:`` line names the type its data says."""
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = []
    for message in text.strip().split("\n\n"):
        name, data = message.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)  # the SDK's own type for it
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_string_input_matches_the_engine(
    client: openai.OpenAI, session: Session, server: ServerThread, model_name: str
) -> None:
    messages = [{"role": "user", "content": QUESTION}]
    ids, want = engine_answer(session, messages, ROOM)
    assert want.finish_reason == "stop"
    reply = client.responses.create(
        model=model_name, input=QUESTION, max_output_tokens=ROOM, temperature=0
    )
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "completed" and reply.incomplete_details is None
    assert reply.output_text == want.text
    (message,) = reply.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert message.role == "assistant" and message.status == "completed"
    assert [p.type for p in message.content] == ["output_text"]
    usage = reply.usage
    assert usage.input_tokens == len(ids) and usage.output_tokens == len(want.token_ids)
    assert usage.total_tokens == len(ids) + len(want.token_ids)
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert reply.store is False and reply.model == model_name and reply.tools == []
    body = {"model": model_name, "input": QUESTION, "max_output_tokens": ROOM, "temperature": 0}
    raw = post(server, body).json()
    Response.model_validate(raw)  # strictly the SDK's shape
    assert raw["output"][0]["content"][0]["text"] == want.text


def message_items_request(model_name: str) -> dict:
    return {
        "model": model_name,
        "instructions": SYSTEM,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Hello."}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi.", "annotations": []}],
            },
            {"type": "message", "role": "user", "content": QUESTION},
        ],
        "max_output_tokens": ROOM,
        "temperature": 0,
    }


def test_message_items_and_instructions_whole_and_streamed(
    client: openai.OpenAI, session: Session, model_name: str
) -> None:
    chat = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": QUESTION},
    ]
    _, want = engine_answer(session, chat, ROOM)
    assert want.finish_reason == "stop"
    request = message_items_request(model_name)
    reply = client.responses.create(**request)
    assert reply.output_text == want.text and reply.instructions == SYSTEM
    deltas = []
    with client.responses.stream(**request) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == want.text and len(deltas) > 1
    assert final.status == "completed" and final.output_text == want.text
    assert final.usage.output_tokens == len(want.token_ids)


def test_create_stream_sends_the_typed_events_in_order(
    client: openai.OpenAI, server: ServerThread, model_name: str
) -> None:
    request = message_items_request(model_name)
    types = [event.type for event in client.responses.create(**request, stream=True)]
    n = types.count("response.output_text.delta")
    assert n > 0
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * n,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    events = raw_events(server, {**request, "stream": True})
    created, final = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert final["id"] == created["id"] and final["usage"]["output_tokens"] > 0
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert done["item"]["content"][0]["text"] == text == final["output"][0]["content"][0]["text"]


def test_max_output_tokens_makes_the_response_incomplete(
    client: openai.OpenAI, session: Session, server: ServerThread, model_name: str
) -> None:
    _, want = engine_answer(session, [{"role": "user", "content": QUESTION}], 3)
    request = {"model": model_name, "input": QUESTION, "max_output_tokens": 3, "temperature": 0}
    reply = client.responses.create(**request)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == want.text and reply.usage.output_tokens == 3
    assert reply.output[0].status == "incomplete"
    events = raw_events(server, {**request, "stream": True})
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["content"][0]["text"] == want.text


COLOUR = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["colour", "count"],
    "additionalProperties": False,
}


class Colour(BaseModel):
    colour: Literal["red", "green", "blue"]
    count: int = Field(ge=0, le=9)


def test_text_format_json_schema_output_validates(client: openai.OpenAI, model_name: str) -> None:
    fmt = {"type": "json_schema", "name": "colour", "schema": COLOUR, "strict": True}
    reply = client.responses.create(
        model=model_name,
        input="Pick a colour and a count.",
        text={"format": fmt},
        max_output_tokens=60,
        temperature=0,
    )
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), COLOUR)
    assert reply.text.format.type == "json_schema" and reply.text.format.name == "colour"
    parsed = client.responses.parse(
        model=model_name, input="Pick a colour.", text_format=Colour, max_output_tokens=60
    )
    assert isinstance(parsed.output_parsed, Colour)
    loose = client.responses.create(
        model=model_name,
        input="Describe the sky as JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        temperature=0,
    )
    if loose.status == "completed":  # cut short, the JSON may be unfinished
        assert isinstance(json.loads(loose.output_text), dict)


def test_required_tool_choice_gives_a_valid_function_call(
    client: openai.OpenAI, server: ServerThread, model_name: str
) -> None:
    request = {
        "model": model_name,
        "input": WEATHER_ASK,
        "tools": FLAT_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 80,
        "temperature": 0,
    }
    reply = client.responses.create(**request)
    assert reply.status == "completed"
    (call,) = reply.output
    assert call.type == "function_call" and call.id.startswith("fc_") and call.call_id
    check_call(call.name, call.arguments)
    assert [t.name for t in reply.tools] == list(PARAMS) and reply.tool_choice == "required"
    named = {**request, "tool_choice": {"type": "function", "name": "get_time"}, "stream": True}
    events = raw_events(server, named)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "function_call" and item["name"] == "get_time"
    assert "".join(deltas) == done["arguments"] == item["arguments"]
    check_call("get_time", item["arguments"])


def test_function_call_output_round_trip_answers_like_chat(
    client: openai.OpenAI, model_name: str
) -> None:
    call = {"call_id": "call_abc123", "name": "get_weather"}
    arguments = '{"city": "Paris", "unit": "celsius"}'
    result = '{"temperature": 21, "sky": "clear"}'
    reply = client.responses.create(
        model=model_name,
        input=[
            {"role": "user", "content": WEATHER_ASK},
            {"type": "function_call", **call, "arguments": arguments},
            {"type": "function_call_output", "call_id": call["call_id"], "output": result},
        ],
        tools=FLAT_TOOLS,
        max_output_tokens=SHORT,
        temperature=0,
    )
    history = [
        {"role": "user", "content": WEATHER_ASK},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["call_id"], "content": result},
    ]
    chat = client.chat.completions.create(
        model=model_name, messages=history, tools=TOOLS, max_tokens=SHORT, temperature=0
    )
    choice = chat.choices[0]
    if choice.message.tool_calls:  # the model called again: the same call, as an item
        assert [(o.type, o.name) for o in reply.output if o.type == "function_call"] == [
            ("function_call", c.function.name) for c in choice.message.tool_calls
        ]
    else:
        assert reply.output_text == choice.message.content


SCHEMA = "text.format.schema"
ROUND = [
    {"role": "user", "content": WEATHER_ASK},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_123"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [FLAT_TOOLS[0], {"type": "code_interpreter"}]}, "tools[1].type"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": FLAT_TOOLS}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (  # an image is checked before the model (this one reads none)
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].image_url",
        ),
        ({"input": [*ROUND[:1], {**ROUND[1], "arguments": "{not json"}]}, "input[1].arguments"),
        (
            {"input": [*ROUND, {"type": "function_call_output", "call_id": "nope", "output": "1"}]},
            "input[2].call_id",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, SCHEMA),
        ({"text": {"format": {"type": "json_schema", "schema": {"type": 3}}}}, SCHEMA),
        ({"input": []}, "input"),
    ],
)
def test_unsupported_or_malformed_requests_are_400s_naming_the_field(
    client: openai.OpenAI, model_name: str, extra: dict, param: str
) -> None:
    request = {"model": model_name, "input": WEATHER_ASK, "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**request)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and error["message"].startswith(param + ": "), error


@pytest.mark.parametrize(
    ("extra", "param", "where"),
    [
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name", "tools[0].name"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "text.format.type"),
        ({"tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice", "tool_choice"),  # no tools
    ],
)
def test_what_the_document_refuses_is_refused_by_the_body(
    client: openai.OpenAI, model_name: str, extra: dict, param: str, where: str
) -> None:
    """Refused by the body's model, as /openapi.json states: a 400 naming the field."""
    request = {"model": model_name, "input": WEATHER_ASK, "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**request)
    error = caught.value.body
    assert error["param"] == param and error["message"].startswith(where + ": "), error


def test_store_false_and_an_unknown_model(client: openai.OpenAI, model_name: str) -> None:
    reply = client.responses.create(
        model=model_name, input=QUESTION, store=False, max_output_tokens=2, temperature=0
    )
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input=QUESTION, max_output_tokens=2)


def test_the_route_is_in_the_openapi_schema(server: ServerThread) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    post_op = schema["paths"]["/v1/responses"]["post"]
    ref = post_op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"input", "instructions", "max_output_tokens", "tools", "store"} <= set(
        body["properties"]
    )
