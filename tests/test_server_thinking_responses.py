"""The Responses API on a thinking model, through the real server with the official ``openai``
client (tests/test_server_thinking.py's Qwen3-templated scripted model): the reasoning is a
``reasoning`` item (``reasoning_text`` content, empty summary) before the message, streamed as
``response.reasoning_text.delta`` events; ``usage.output_tokens_details.reasoning_tokens``
counts it; ``reasoning.effort`` maps as chat's ``reasoning_effort``; a response cut short in
its reasoning has no message; earlier reasoning items go back to the template."""

from __future__ import annotations

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from localinfer.server.responses_api_schemas import ResponsesRequest
from localinfer.server.responses_api_translate import translate_request
from tests.test_server_thinking import ANSWER, SCRIPT, THOUGHT, served  # noqa: F401

QUESTION = "What is 2+2?"
LONG = "<think>\n" + "step " * 80 + "</think>\n\nDone."
EVENTS = TypeAdapter(ResponseStreamEvent)


def respond(served, script: str = SCRIPT, **options):  # noqa: F811
    session, client, _ = served
    session.script(script)
    options.setdefault("input", QUESTION)
    options.setdefault("max_output_tokens", 200)
    return client.responses.create(model=session.model.name, temperature=0, **options)


def test_the_reasoning_is_an_item_before_the_message(served) -> None:  # noqa: F811
    reply = respond(served)
    assert reply.status == "completed"
    reasoning, message = reply.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.summary == [] and reasoning.status == "completed"
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THOUGHT)]
    assert message.type == "message" and reply.output_text == ANSWER
    tokens = reply.usage.output_tokens_details.reasoning_tokens
    assert 0 < tokens < reply.usage.output_tokens


def test_the_stream_sends_reasoning_text_events_then_the_message(served) -> None:  # noqa: F811
    events = list(respond(served, stream=True))
    for event in events:  # the SDK's own event types, field for field
        EVENTS.validate_python(event.model_dump())
    kinds = [e.type.removeprefix("response.") for e in events]
    first_text = kinds.index("output_text.delta")
    reasoning_part = kinds[2 : kinds.index("reasoning_text.done") + 3]
    assert reasoning_part[:3] == ["output_item.added", "content_part.added", "reasoning_text.delta"]
    assert reasoning_part[-3:] == ["reasoning_text.done", "content_part.done", "output_item.done"]
    assert kinds.index("output_item.done") < first_text
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == THOUGHT
    assert all(e.output_index == 0 for e in events if e.type.startswith("response.reasoning"))
    final = events[-1].response
    whole = respond(served)
    assert [i.type for i in final.output] == [i.type for i in whole.output]
    assert final.output[0].content == whole.output[0].content
    assert final.output_text == ANSWER
    assert final.usage.output_tokens_details == whole.usage.output_tokens_details


def test_the_sdk_stream_helper_reads_the_reasoning(served) -> None:  # noqa: F811
    session, client, _ = served
    session.script(SCRIPT)
    with client.responses.stream(
        model=session.model.name, input=QUESTION, max_output_tokens=200, temperature=0
    ) as stream:
        final = stream.get_final_response()
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == THOUGHT and final.output_text == ANSWER


def test_effort_none_turns_thinking_off(served) -> None:  # noqa: F811
    reply = respond(served, ANSWER, reasoning={"effort": "none"})
    assert [i.type for i in reply.output] == ["message"] and reply.output_text == ANSWER
    assert reply.reasoning.effort == "none"
    assert reply.usage.output_tokens_details.reasoning_tokens == 0


def test_effort_maps_as_chats_reasoning_effort() -> None:
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
        body = ResponsesRequest.model_validate({"input": "hi", "reasoning": {"effort": effort}})
        assert translate_request(body).chat.reasoning_effort == effort
    body = ResponsesRequest.model_validate({"input": "hi", "reasoning": {"summary": "auto"}})
    assert translate_request(body).chat.reasoning_effort is None


def test_cut_short_in_the_reasoning_there_is_no_message(served) -> None:  # noqa: F811
    reply = respond(served, LONG, max_output_tokens=12)
    assert reply.status == "incomplete"
    (item,) = reply.output
    assert item.type == "reasoning" and item.status == "incomplete"
    assert item.content[0].text.startswith("step step")
    events = list(respond(served, LONG, max_output_tokens=12, stream=True))
    final = events[-1]
    assert final.type == "response.incomplete"
    assert [(i.type, i.status) for i in final.response.output] == [("reasoning", "incomplete")]
    assert "response.output_text.delta" not in [e.type for e in events]


def test_earlier_reasoning_items_go_back_to_the_template(served) -> None:  # noqa: F811
    session = served[0]
    thought = [{"type": "reasoning_text", "text": "I should look it up."}]
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "content": thought}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "12 C"}
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]

    def prompt_length(items: list[dict]) -> int:
        respond(served, ANSWER, input=[{"role": "user", "content": QUESTION}, *items], tools=tools)
        return session.runner.prompt_len[0]

    # In a tool loop Qwen3's template keeps the reasoning of the turn that made the call.
    assert prompt_length([reasoning, call, result]) > prompt_length([call, result])
    body = ResponsesRequest.model_validate(
        {"input": [{"role": "user", "content": "hi"}, reasoning, call, result]}
    )
    turn = translate_request(body).chat.messages[1]
    assert turn.reasoning_content == "I should look it up."  # type: ignore[union-attr]
