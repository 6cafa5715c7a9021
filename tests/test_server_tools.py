# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Tool calling through the real server and the official ``openai`` client.

Forced calls (``tool_choice`` required or named) run on the embedded model: the engine's
constraint makes every call valid JSON matching the function's parameters. ``auto`` parsing is
checked on answers the model is scripted to write (tests/test_server_scripted.py's server), so
each family rule — a call, text then a call, JSON-looking prose, a malformed call — is exercised
through HTTP exactly.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletion

from localinfer.server import ServerThread
from tests.test_server_support import (  # noqa: F401 - fixtures
    client,
    model_name,
    server,
    session,
    sse_lines,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 24}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_call(name: str, arguments: str) -> dict:
    """The call names an offered tool and its arguments validate against that tool's schema."""
    assert name in PARAMS
    args = json.loads(arguments)
    jsonschema.validate(args, PARAMS[name])
    return args


@pytest.fixture(scope="module")
def required_call(client: openai.OpenAI, model_name: str) -> ChatCompletion:
    """One greedy required call, asked once: its checks and the history round trip read it."""
    return client.chat.completions.create(
        model=model_name,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )


def test_required_call_is_valid_and_finishes_with_tool_calls(required_call: ChatCompletion) -> None:
    choice = required_call.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    check_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_calls_at_the_default_temperature_fit_48_tokens(
    client: openai.OpenAI, model_name: str, tool_choice: object
) -> None:
    """Forced calls are compact JSON (constraints.compiler.COMPACT_JSON): at temperature 1 the
    model has no whitespace to wander into, and every try is a call (seeded, so the test is
    repeatable; the seeds are not picked). The tries run side by side: the session's slots decode
    them in one batch, and the torch runner's logits do not depend on the batch."""

    def ask(seed: int) -> ChatCompletion:
        return client.chat.completions.create(
            model=model_name,
            messages=ASK,
            tools=TOOLS,
            tool_choice=tool_choice,  # type: ignore[arg-type]
            max_tokens=48,
            seed=seed,
        )

    with ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(ask, range(5)))
    for seed, reply in enumerate(replies):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, seed
        for call in choice.message.tool_calls:
            check_call(call.function.name, call.function.arguments)


def test_named_call_streams_id_and_name_first_then_arguments(
    client: openai.OpenAI, model_name: str
) -> None:
    stream = client.chat.completions.create(
        model=model_name,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    starts, arguments, finish = [], [], None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        assert not choice.delta.content  # a forced call is never content
        for delta in choice.delta.tool_calls or ():
            assert delta.index == 0
            if delta.id is not None:
                assert not arguments, "id and name come before any argument text"
                starts.append((delta.id, delta.function.name))
            elif delta.function.arguments:
                arguments.append(delta.function.arguments)
    assert finish == "tool_calls"
    assert len(starts) == 1 and starts[0][1] == "get_time"
    assert check_call("get_time", "".join(arguments))


def test_parallel_required_calls_are_each_valid(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Weather in Paris and the time in Tokyo?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=160,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    for call in calls:
        check_call(call.function.name, call.function.arguments)


def test_tool_history_round_trip(
    client: openai.OpenAI, model_name: str, required_call: ChatCompletion
) -> None:
    first = required_call
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    second = client.chat.completions.create(
        model=model_name, messages=history, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            [
                *ASK,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{not json"},
                        }
                    ],
                },
            ],
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            [*ASK, {"role": "tool", "tool_call_id": "call_nowhere", "content": "21"}],
            "messages[1].tool_call_id",
        ),
    ],
)
def test_malformed_tool_history_is_a_400_naming_the_field(
    server: ServerThread, model_name: str, messages: list, param: str
) -> None:
    body = {"model": model_name, "messages": messages, "tools": TOOLS, "max_tokens": 4}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_bad_tool_parameters_are_400s(
    server: ServerThread, model_name: str, extra: dict, param: str
) -> None:
    body = {"model": model_name, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)


def test_streamed_forced_call_over_raw_sse(server: ServerThread, model_name: str) -> None:
    body = {
        "model": model_name,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 80,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        payloads = sse_lines(r)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    deltas = [c["choices"][0]["delta"].get("tool_calls") for c in chunks]
    calls = [d[0] for d in deltas if d]
    assert calls[0]["id"] and calls[0]["type"] == "function"
    assert calls[0]["function"]["arguments"] == ""
    arguments = "".join(c["function"]["arguments"] for c in calls[1:])
    check_call(calls[0]["function"]["name"], arguments)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
