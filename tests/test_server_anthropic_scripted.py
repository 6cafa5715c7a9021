"""Anthropic's tool_use content blocks, exactly, on answers a model is scripted to write (the
scripted server of tests/test_server_scripted.py): ``tool_choice`` auto through /v1/messages,
streamed and whole, against the OpenAI route on the same answer. Plus the renderer and the
translation on their own (the event of a failure mid-stream, Anthropic's defaults)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from localinfer.server.anthropic_render import AnthropicRenderer
from localinfer.server.anthropic_schemas import MessagesRequest
from localinfer.server.anthropic_translate import chat_request
from localinfer.server.errors import APIError
from localinfer.server.tool_schemas import tool_dicts
from tests.test_server_anthropic import ASK, TIME, WEATHER, events
from tests.test_server_scripted import CALL, ScriptedSession
from tests.test_server_support import client_for
from tests.test_server_tools import TOOLS

SECOND = CALL.replace("get_weather", "get_time").replace(
    '{"city": "Paris", "unit": "celsius"}', '{"zone": "Europe/Paris"}'
)


class Scripted:
    """The scripted session behind a server, with both official clients."""

    def __init__(self, session: ScriptedSession, server: ServerThread) -> None:
        self.session = session
        self.server = server
        self.claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        self.openai: openai.OpenAI = client_for(server)

    def body(self, text: str, **options: object) -> dict:
        self.session.script(text)
        return {
            "model": self.session.model.name,
            "messages": ASK,
            "tools": [WEATHER, TIME],
            "max_tokens": 200,
            "temperature": 0,
            **options,
        }


@pytest.fixture(scope="module")
def scripted() -> Iterator[Scripted]:
    session = ScriptedSession(load_model(embedded_model_path()))
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        yield Scripted(session, server)
    session.close()


def blocks_streamed(s: Scripted, text: str) -> tuple[list[dict], list[str], str]:
    """(content blocks, input_json_delta pieces, stop_reason) from the raw event stream."""
    blocks: list[dict] = []
    pieces: list[str] = []
    reason = ""
    for name, data in events(s.server, s.body(text, stream=True)):
        if name == "content_block_start":
            assert data["index"] == len(blocks)
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                pieces.append(delta["partial_json"])
                block["json"] = block.get("json", "") + delta["partial_json"]
        elif name == "message_delta":
            reason = data["delta"]["stop_reason"]
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = json.loads(block.pop("json"))
    return blocks, pieces, reason


def whole(s: Scripted, text: str, **options: object) -> anthropic.types.Message:
    body = s.body(text, **options)
    extra = {"temperature": body.pop("temperature")}
    return s.claude.messages.create(**body, extra_body=extra)


def test_a_call_streams_as_input_json_pieces_of_the_calls_json(scripted: Scripted) -> None:
    blocks, pieces, reason = blocks_streamed(scripted, CALL)
    assert reason == "tool_use" and pieces
    ((block),) = blocks
    assert block["type"] == "tool_use" and block["name"] == "get_weather"
    assert block["id"].startswith("toolu_")
    # The pieces are the OpenAI route's argument text for the same answer, split alike.
    scripted.session.script(CALL)
    stream = scripted.openai.chat.completions.create(
        model=scripted.session.model.name,
        messages=ASK,
        tools=TOOLS,
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    openai_pieces = [
        d.function.arguments
        for chunk in stream
        for d in chunk.choices[0].delta.tool_calls or ()
        if d.function.arguments
    ]
    assert pieces == openai_pieces
    assert block["input"] == {"city": "Paris", "unit": "celsius"}
    reply = whole(scripted, CALL)
    assert reply.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in reply.content] == [
        ("tool_use", "get_weather", block["input"])
    ]


def test_prose_then_two_calls_are_three_blocks(scripted: Scripted) -> None:
    text = "Let me look that up.\n" + CALL + "\n" + SECOND
    blocks, _, reason = blocks_streamed(scripted, text)
    assert reason == "tool_use"
    want = [
        {"type": "text", "text": "Let me look that up."},
        {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris", "unit": "celsius"}},
        {"type": "tool_use", "name": "get_time", "input": {"zone": "Europe/Paris"}},
    ]
    assert [{k: v for k, v in b.items() if k != "id"} for b in blocks] == want
    reply = whole(scripted, text)
    assert [b.model_dump(include={"type", "text", "name", "input"}) for b in reply.content] == want
    ids = [b.id for b in reply.content if b.type == "tool_use"]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)
    scripted.session.script(text)
    with scripted.claude.messages.stream(
        **{k: v for k, v in scripted.body(text).items() if k != "temperature"},
        extra_body={"temperature": 0},
    ) as stream:
        final = stream.get_final_message()
    assert [b.model_dump(include={"type", "text", "name", "input"}) for b in final.content] == want


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',  # unknown tool
        "Plain words, ending in a newline.\n",
    ],
)
def test_text_that_is_no_call_stays_text(scripted: Scripted, text: str) -> None:
    blocks, _, reason = blocks_streamed(scripted, text)
    assert (blocks, reason) == ([{"type": "text", "text": text}], "end_turn")
    reply = whole(scripted, text)
    assert [(b.type, b.text) for b in reply.content] == [("text", text)]


def test_tool_choice_none_writes_the_call_as_text(scripted: Scripted) -> None:
    reply = whole(scripted, CALL, tool_choice={"type": "none"})
    assert reply.stop_reason == "end_turn" and [b.text for b in reply.content] == [CALL]


# -- renderer and translation on their own ---------------------------------------------------


def test_a_failure_mid_stream_is_an_error_event() -> None:
    renderer = AnthropicRenderer("m", 5)
    (message,) = renderer.failure(APIError(503, "the request was aborted", code="aborted"))
    name, data = message.decode().strip().split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the request was aborted"},
    }
    (message,) = renderer.failure(APIError(500, "boom", code="engine_error"))
    assert json.loads(message.decode().split("data: ")[1])["error"]["type"] == "api_error"


A1 = '{"a": 1}'


def test_translation_defaults_and_blocks() -> None:
    body = MessagesRequest.model_validate(
        {
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True},
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                    ],
                },
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "metadata": {"user_id": "u"},
        }
    )
    chat = chat_request(body)
    request = chat.request
    assert request.temperature == 1.0  # Anthropic's default, not left to OpenAI's
    assert (request.max_tokens, request.tool_choice, request.parallel_tool_calls) == (
        5,
        "required",
        False,
    )
    assert [m.as_openai() for m in request.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1}'},
                }
            ],
            "reasoning_content": "hm",  # the thinking block, for the template to keep or drop
        },
        {"role": "tool", "content": "Error: ", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "ok", "tool_call_id": "toolu_1"},
    ]
    assert chat.origins == [
        "system",
        "messages[0]",
        "messages[1]",
        "messages[2].content[0]",
        "messages[2].content[1]",
    ]
    assert tool_dicts(request.tools) == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    body.tool_choice = None
    assert chat_request(body).request.tool_choice is None  # auto with tools, as OpenAI's default


def test_unknown_model_and_empty_body_on_the_scripted_server(scripted: Scripted) -> None:
    r = httpx.post(scripted.server.url + "/v1/messages/count_tokens", json={"model": "other"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.post(
        scripted.server.url + "/v1/messages/count_tokens",
        json={"model": "other", "messages": ASK},
    )
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
