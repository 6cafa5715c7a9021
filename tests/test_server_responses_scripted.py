"""``/v1/responses`` with ``tool_choice: auto`` on answers a model is scripted to write
(tests/test_server_scripted.py's ScriptedSession), so calls come out exactly: as
``function_call`` items whole, and streamed as ``function_call_arguments`` deltas that join to
the arguments; text before a call is a message item of its own. Also the stream's ``error``
event, written by the renderer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from unittest.mock import ANY

import httpx
import openai
import pytest

from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from localinfer.server.answer_render import FinishedAnswer
from localinfer.server.errors import APIError
from localinfer.server.responses_api_render import ResponseHead, ResponsesRenderer, whole_output
from localinfer.tools import ContentDelta, ToolCall, ToolCallArguments, ToolCallStart
from tests.test_server_responses_api import EVENTS, FLAT_TOOLS, WEATHER_ASK
from tests.test_server_scripted import CALL, ScriptedSession
from tests.test_server_support import client_for

PARIS = {"city": "Paris", "unit": "celsius"}
SECOND = CALL.replace("get_weather", "get_time").replace(
    '{"city": "Paris", "unit": "celsius"}', '{"zone": "Europe/Paris"}'
)


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedSession, ServerThread]]:
    session = ScriptedSession(load_model(embedded_model_path()))
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        yield session, server
    session.close()


def request(session: ScriptedSession, **extra: object) -> dict:
    return {
        "model": session.model.name,
        "input": WEATHER_ASK,
        "tools": FLAT_TOOLS,
        "max_output_tokens": 200,
        "temperature": 0,
        **extra,
    }


def events_of(server: ServerThread, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    events = [json.loads(m.split("\ndata: ")[1]) for m in text.strip().split("\n\n")]
    for event in events:
        EVENTS.validate_python(event)
    return events


def test_an_auto_call_is_a_function_call_item(scripted) -> None:
    session, server = scripted
    session.script(CALL)
    reply = client_for(server).responses.create(**request(session))
    assert reply.status == "completed"
    (item,) = reply.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    assert json.loads(item.arguments) == PARIS


def test_an_auto_call_streams_its_arguments(scripted) -> None:
    session, server = scripted
    session.script(CALL)
    events = events_of(server, request(session, stream=True))
    types = [e["type"] for e in events]
    n = types.count("response.function_call_arguments.delta")
    assert n >= 1
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * n,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather"
    assert added["arguments"] == "" and added["status"] == "in_progress"
    pieces = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert pieces == events[-3]["arguments"] == events[-2]["item"]["arguments"]
    assert json.loads(pieces) == PARIS
    (final,) = events[-1]["response"]["output"]
    assert final == events[-2]["item"] and final["status"] == "completed"
    with client_for(server).responses.stream(**request(session)) as stream:
        snapshots = [e.snapshot for e in stream if e.type.endswith("arguments.delta")]
        done = stream.get_final_response()
    assert snapshots[-1] == done.output[0].arguments and json.loads(snapshots[-1]) == PARIS


def test_prose_then_two_calls_are_three_items(scripted) -> None:
    session, server = scripted
    session.script("Let me look that up.\n" + CALL + "\n" + SECOND)
    reply = client_for(server).responses.create(**request(session))
    assert [o.type for o in reply.output] == ["message", "function_call", "function_call"]
    assert reply.output_text.strip() == "Let me look that up."
    assert [o.name for o in reply.output[1:]] == ["get_weather", "get_time"]
    assert json.loads(reply.output[2].arguments) == {"zone": "Europe/Paris"}
    events = events_of(server, request(session, stream=True))
    added = [
        (e["output_index"], e["item"]["type"])
        for e in events
        if e["type"] == "response.output_item.added"
    ]
    assert added == [(0, "message"), (1, "function_call"), (2, "function_call")]
    final = events[-1]["response"]["output"]
    assert [o["type"] for o in final] == ["message", "function_call", "function_call"]
    assert len({o["id"] for o in final}) == 3
    by_item = {}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            by_item[e["item_id"]] = by_item.get(e["item_id"], "") + e["delta"]
    assert [by_item[o["id"]] for o in final[1:]] == [o["arguments"] for o in final[1:]]


def test_tool_choice_none_leaves_the_call_as_text(scripted) -> None:
    session, server = scripted
    session.script(CALL)
    reply = client_for(server).responses.create(**request(session, tool_choice="none"))
    assert [o.type for o in reply.output] == ["message"] and reply.output_text == CALL


def renderer() -> ResponsesRenderer:
    head = ResponseHead(
        model="m", instructions=None, max_output_tokens=None, temperature=1.0, top_p=1.0,
        parallel_tool_calls=True, tool_choice="auto", tools=[], text={"format": {"type": "text"}},
    )  # fmt: skip
    return ResponsesRenderer(head)


def final_output(deltas: list, finish_reason: str = "stop") -> list[dict]:
    """The output of the response.completed (or .incomplete) event after ``deltas``."""
    r = renderer()
    r.opening()
    r.deltas(deltas, ())
    answer = FinishedAnswer("", [], finish_reason, (), None, 3, 5)
    last = r.closing(answer)[-1].decode().split("\ndata: ")[1]
    response = json.loads(last)["response"]
    assert response["usage"]["total_tokens"] == 8
    return response["output"]


def test_stream_items_follow_the_text_and_calls_in_order() -> None:
    call = [ToolCallStart(0, "call_1", "f"), ToolCallArguments(0, '{"a": 1}')]
    output = final_output([ContentDelta("\n"), *call, ContentDelta("\n"), ContentDelta("Done.")])
    assert [o["type"] for o in output] == ["function_call", "message"]
    assert output[0]["arguments"] == '{"a": 1}'
    assert output[1]["content"][0]["text"] == "\nDone."
    blank = final_output([ContentDelta("  ")], finish_reason="length")
    assert [(o["type"], o["status"]) for o in blank] == [("message", "incomplete")]
    assert blank[0]["content"][0]["text"] == "  "
    assert final_output([*call, ContentDelta("\n")]) == [dict(output[0], id=ANY)]
    calls = [ToolCall("call_1", "f", "{}")]
    whole = whole_output(FinishedAnswer("\n", calls, "tool_calls", (), None, 3, 5))
    assert [o["type"] for o in whole] == ["function_call"]


def test_an_error_mid_stream_is_an_error_event() -> None:
    renderer_ = renderer()
    opening = renderer_.opening()
    failure = renderer_.failure(APIError(500, "the engine failed", code="engine_error"))
    (message,) = failure
    name, data = message.decode().strip().split("\n")
    event = json.loads(data.removeprefix("data: "))
    assert name == "event: error" and EVENTS.validate_python(event).type == "error"
    assert event["sequence_number"] == len(opening)
    assert (event["code"], event["message"]) == ("engine_error", "the engine failed")


def test_the_client_sees_an_error_event_as_such() -> None:
    event = EVENTS.validate_python(
        {"type": "error", "sequence_number": 3, "code": "x", "message": "m", "param": None}
    )
    assert isinstance(event, openai.types.responses.ResponseErrorEvent)
