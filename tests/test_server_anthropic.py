# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""The official ``anthropic`` client against a real server on the embedded model: /v1/messages
whole and streamed, tools, count_tokens, x-api-key and Anthropic-shaped errors.

References come from the engine called directly on the same rendered prompt, or from the
OpenAI route given the same conversation, so each test checks that translating the Anthropic
request changes nothing. The SDK (2.x) no longer takes sampling arguments, so temperature and
top_k travel in ``extra_body``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import openai
import pytest

from localinfer.server import ServerThread
from localinfer.server.limits import RequestLimits
from localinfer.session import Session
from tests.test_server_openai import direct
from tests.test_server_support import (  # noqa: F401 - fixtures
    SHORT,
    client,
    model_name,
    server,
    serving,
    session,
)

GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "Name three colours."}]
SYSTEM = "You answer in one short sentence."
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "description": "The local time in a time zone",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 24}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def events(server: ServerThread, body: dict, **headers: str) -> Iterator[tuple[str, dict]]:
    """(event name, data) of a raw /v1/messages stream; each name is its data's type."""
    with httpx.stream(
        "POST", server.url + "/v1/messages", json=body, headers=headers, timeout=300
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    for name, data in zip(lines[::2], lines[1::2], strict=True):
        payload = json.loads(data.removeprefix("data: "))
        assert name == "event: " + payload["type"]
        yield payload["type"], payload


def test_create_with_a_system_prompt_matches_the_engine(
    claude: anthropic.Anthropic, session: Session, model_name: str
) -> None:
    as_openai = [{"role": "system", "content": SYSTEM}, *QUESTION]
    want, n_tokens = direct(session, as_openai)
    for system in (SYSTEM, [{"type": "text", "text": SYSTEM, "cache_control": {"type": "x"}}]):
        reply = claude.messages.create(
            model=model_name, system=system, messages=QUESTION, max_tokens=SHORT, extra_body=GREEDY
        )
        assert reply.type == "message" and reply.role == "assistant"
        assert reply.id.startswith("msg_") and reply.model == model_name
        assert [block.type for block in reply.content] == ["text"]
        assert text_of(reply) == want
        assert reply.stop_reason == ("max_tokens" if n_tokens == SHORT else "end_turn")
        assert reply.stop_sequence is None
        assert reply.usage.input_tokens == len(session.chat_prompt_ids(as_openai))
        assert reply.usage.output_tokens == n_tokens


def test_stream_equals_the_whole_answer(
    claude: anthropic.Anthropic, session: Session, model_name: str, server: ServerThread
) -> None:
    want, n_tokens = direct(session, QUESTION)
    with claude.messages.stream(
        model=model_name, messages=QUESTION, max_tokens=SHORT, extra_body=GREEDY
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == want
    assert text_of(final) == want and final.id.startswith("msg_")
    assert final.usage.output_tokens == n_tokens
    assert final.usage.input_tokens == len(session.chat_prompt_ids(QUESTION))
    body = {"model": model_name, "messages": QUESTION, "max_tokens": 3, "stream": True, **GREEDY}
    names = [name for name, _ in events(server, body)]
    assert names[:2] == ["message_start", "content_block_start"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    stream_events = dict(events(server, body))  # the last of each name
    assert stream_events["message_delta"]["delta"]["stop_reason"] == "max_tokens"
    assert stream_events["message_delta"]["usage"]["output_tokens"] == 3
    assert stream_events["message_start"]["message"]["content"] == []


def test_max_tokens_top_k_and_stop_sequences(
    claude: anthropic.Anthropic, session: Session, model_name: str
) -> None:
    want, _ = direct(session, QUESTION, max_tokens=2)
    reply = claude.messages.create(
        model=model_name, messages=QUESTION, max_tokens=2, extra_body=GREEDY
    )
    assert (text_of(reply), reply.stop_reason, reply.usage.output_tokens) == (want, "max_tokens", 2)
    # Anthropic's default temperature (1.0) with top_k 1 is greedy: top_k reaches the sampler.
    reply = claude.messages.create(
        model=model_name, messages=QUESTION, max_tokens=2, extra_body={"top_k": 1}
    )
    assert text_of(reply) == want
    full, _ = direct(session, QUESTION, max_tokens=16)
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = full[: full.index(stop)]
    reply = claude.messages.create(
        model=model_name,
        messages=QUESTION,
        max_tokens=16,
        stop_sequences=["@@never@@", stop],
        extra_body=GREEDY,
    )
    assert text_of(reply) == cut
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    with claude.messages.stream(
        model=model_name, messages=QUESTION, max_tokens=16, stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        assert "".join(stream.text_stream) == cut
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_forced_tool_use_is_valid(
    claude: anthropic.Anthropic, model_name: str, choice: dict
) -> None:
    reply = claude.messages.create(
        model=model_name,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={**choice, "disable_parallel_tool_use": True},
        max_tokens=60,
        extra_body=GREEDY,
    )
    assert reply.stop_reason == "tool_use"
    (call,) = [block for block in reply.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and isinstance(call.input, dict)
    if choice["type"] == "tool":
        assert call.name == "get_time"
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.name]["input_schema"]
    jsonschema.validate(call.input, schema)
    with claude.messages.stream(
        model=model_name,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={**choice, "disable_parallel_tool_use": True},
        max_tokens=60,
        extra_body=GREEDY,
    ) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [
        ("tool_use", call.name, call.input)
    ]
    assert final.stop_reason == "tool_use"


def test_a_tool_result_round_trip_equals_the_openai_route(
    claude: anthropic.Anthropic, client: openai.OpenAI, model_name: str
) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Paris", "unit": "celsius"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C, sunny"},
                {"type": "text", "text": "Answer briefly."},
            ],
        },
    ]
    as_openai = [
        *ASK,
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": json.dumps({"city": "Paris", "unit": "celsius"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "18 C, sunny"},
        {"role": "user", "content": "Answer briefly."},
    ]
    tools = [{"type": "function", "function": {**WEATHER, "parameters": WEATHER["input_schema"]}}]
    del tools[0]["function"]["input_schema"]
    want = client.chat.completions.create(
        model=model_name,
        messages=as_openai,
        tools=tools,
        tool_choice="none",
        max_tokens=SHORT,
        temperature=0,
    )
    reply = claude.messages.create(
        model=model_name,
        messages=history,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        max_tokens=SHORT,
        extra_body=GREEDY,
    )
    assert text_of(reply) == want.choices[0].message.content
    assert reply.usage.input_tokens == want.usage.prompt_tokens
    counted = claude.messages.count_tokens(
        model=model_name, messages=history, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert counted.input_tokens == want.usage.prompt_tokens


def test_count_tokens_is_the_prompt_length(
    claude: anthropic.Anthropic, session: Session, model_name: str
) -> None:
    counted = claude.messages.count_tokens(model=model_name, system=SYSTEM, messages=QUESTION)
    as_openai = [{"role": "system", "content": SYSTEM}, *QUESTION]
    assert counted.input_tokens == len(session.chat_prompt_ids(as_openai))
    with_tools = claude.messages.count_tokens(model=model_name, messages=ASK, tools=[WEATHER])
    reply = claude.messages.create(
        model=model_name, messages=ASK, tools=[WEATHER], max_tokens=1, extra_body=GREEDY
    )
    assert with_tools.input_tokens == reply.usage.input_tokens
    assert with_tools.input_tokens > len(session.chat_prompt_ids(ASK))  # the tools are in it


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind
    return body["error"]["message"]


def test_x_api_key_and_refusals_before_the_route(session: Session, model_name: str) -> None:
    body = {"model": model_name, "messages": QUESTION, "max_tokens": 1}
    with serving(session, api_key="s3cret", limits=RequestLimits(max_body_bytes=4096)) as srv:
        url = srv.url + "/v1/messages"
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
            r = httpx.post(url, json=body, headers=headers, timeout=60)
            assert "x-api-key" in assert_anthropic_error(r, 401, "authentication_error")
        for headers in ({"x-api-key": "s3cret"}, {"Authorization": "Bearer s3cret"}):
            assert httpx.post(url, json=body, headers=headers, timeout=300).status_code == 200
        good = anthropic.Anthropic(base_url=srv.url, api_key="s3cret", max_retries=0)
        assert good.messages.create(model=model_name, messages=QUESTION, max_tokens=1).content
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=srv.url, api_key="nope", max_retries=0).messages.create(
                model=model_name, messages=QUESTION, max_tokens=1
            )
        # OpenAI's routes take the header too, and answer in OpenAI's shape.
        r = httpx.get(srv.url + "/v1/models", headers={"x-api-key": "s3cret"})
        assert r.status_code == 200
        assert httpx.get(srv.url + "/v1/models").json()["error"]["type"] == "authentication_error"
        # The middlewares' refusals (body size, Host) take Anthropic's shape on its paths too.
        key = {"x-api-key": "s3cret"}
        big = {**body, "system": "x" * 5000}
        r = httpx.post(srv.url + "/v1/messages", json=big, headers=key)
        assert_anthropic_error(r, 413, "request_too_large")
        r = httpx.post(srv.url + "/v1/messages", json=body, headers={**key, "Host": "evil.example"})
        assert_anthropic_error(r, 403, "permission_error")


TOOL_USE = {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "X"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_9", "content": "18 C"}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "system", "content": "hi"}]}, "messages[0]: Input tag 'system'"),
        ({"temperature": 1.5}, "temperature"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}
                ]
            },
            "messages[0].content[0].tool_use_id",
        ),
        (
            {"messages": [*ASK, {"role": "assistant", "content": [TOOL_USE]}]},
            "messages[1].role",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0]: document blocks are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [IMAGE]}]},  # (checked before the model)
            "messages[0].content[0].source.data: not an image",
        ),
        ({"tools": [{"name": "bad name!", "input_schema": {}}]}, "tools[0].name: String should"),
        ({"tools": [{"name": "web_search", "type": "web_search_20250305"}]}, "tools[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ],
)
def test_bad_requests_are_anthropic_400s(server: ServerThread, change: dict, field: str) -> None:
    body = {"messages": QUESTION, "max_tokens": 4, **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
    message = assert_anthropic_error(r, 400, "invalid_request_error")
    assert message.startswith(field), message


def test_sdk_errors_and_openapi(claude: anthropic.Anthropic, server: ServerThread) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="m", messages=[], max_tokens=1)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="claude-sonnet-4-5", messages=QUESTION, max_tokens=1)
    assert "claude-sonnet-4-5" in missing.value.body["error"]["message"]
    r = httpx.post(server.url + "/v1/messages/nothing", json={})
    assert "no route for POST /v1/messages/nothing" in assert_anthropic_error(
        r, 404, "not_found_error"
    )
    # Elsewhere errors stay OpenAI's.
    assert "param" in httpx.post(server.url + "/v1/chat/completions", json={}).json()["error"]
    spec = httpx.get(server.url + "/openapi.json").json()
    for path, schema in (
        ("/v1/messages", "MessagesRequest"),
        ("/v1/messages/count_tokens", "CountTokensRequest"),
    ):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"].endswith("/" + schema)
    assert "max_tokens" in spec["components"]["schemas"]["MessagesRequest"]["required"]
