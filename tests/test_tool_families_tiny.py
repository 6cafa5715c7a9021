"""Tool calling end to end with the real chat templates of Qwen 2.5 (hermes), Llama 3.1 and
Mistral Nemo, on tiny random models behind the real server, through the official ``openai``
client (issue #20).

A random model writes nothing a parser would take for a call, so:

* forced calls (``required``, parallel or not, and a named function) must come back as calls of
  offered tools whose arguments validate, whatever the model prefers — streamed as OpenAI does,
  with Mistral's 9-character ids; cut by ``max_tokens`` they are the start of their JSON;
* those calls and their results go back as history and are rendered in each family's syntax
  (checked on the very prompt the server counted);
* ``auto`` answers, sampled with seeds, are exactly what each family's parser makes of the
  tokens the model wrote (read back from the logprobs), streamed or whole;
* a malformed history is a 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from localinfer.tools import ToolFamily, parse_tool_calls, parse_tools
from localinfer.tools.family import template_call_id
from tests.tool_family_helpers import (
    CALL_IDS,
    FAMILIES,
    FamilyServer,
    assert_in_order,
    call_in_prompt,
    read_stream,
    rendered_prompt,
    result_in_prompt,
    served_family,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
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
            "properties": {
                "zone": {"type": "string", "enum": ["UTC", "CET", "JST"]},
                "offset": {"type": "integer", "minimum": -12, "maximum": 14},
            },
            "required": ["zone", "offset"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# A random model fills every gap the JSON grammar allows with whitespace, up to its bound of 16
# characters (localinfer/constraints/compiler.py), one token each at worst. A call of either tool
# has 16 such gaps (14 between its 15 JSON tokens, one before, one after): 256 tokens; its text is
# at most ~160 more (the city's 8 characters as \uXXXX escape pairs: 96). So one whole call always
# fits in 480 tokens, even after a parallel array's "[" and its gap.
CALL_BUDGET = 480
CUT = 12  # tokens: too few for any call


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda spec: spec.key)
def served(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[FamilyServer]:
    root = tmp_path_factory.mktemp("tool-families")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALINFER_CACHE_DIR", str(root / "cache"))
        with served_family(root, request.param) as family_server:
            yield family_server


def ask(served: FamilyServer, messages: list | None = None, **options: object):
    options.setdefault("temperature", 0)
    return served.client.chat.completions.create(
        model=served.name, messages=messages or ASK, tools=TOOLS, **options
    )


def check_call(served: FamilyServer, call_id: str, name: str, arguments: str) -> dict:
    """An offered tool, arguments valid against its parameters, an id of the family's shape."""
    assert CALL_IDS[served.spec.family].fullmatch(call_id), call_id
    assert name in PARAMS
    args = json.loads(arguments)
    jsonschema.validate(args, PARAMS[name])
    return args


# -- 1. forced calls -------------------------------------------------------------------------


@pytest.mark.parametrize("parallel", [False, True], ids=["single", "parallel"])
def test_required_calls_are_valid_streamed_or_whole(served: FamilyServer, parallel: bool) -> None:
    options = {"tool_choice": "required", "parallel_tool_calls": parallel}
    reply = ask(served, max_tokens=CALL_BUDGET, **options)
    choice = reply.choices[0]
    # With parallel calls the array may be cut by max_tokens: the calls it completed are kept.
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.type == "function"
        check_call(served, call.id, call.function.name, call.function.arguments)

    streamed = read_stream(ask(served, max_tokens=CALL_BUDGET, stream=True, **options))
    assert streamed.finish == "tool_calls" and streamed.content == ""
    for call in streamed.calls:
        check_call(served, call.id, call.name, call.arguments)
    # Greedy: the same calls, with ids of their own.
    assert [(c.name, c.arguments) for c in streamed.calls] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert not {c.id for c in streamed.calls} & {c.id for c in calls}


def test_named_call_streams_id_and_name_first(served: FamilyServer) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    streamed = read_stream(
        ask(served, tool_choice=named, max_tokens=CALL_BUDGET, stream=True)
    )  # read_stream checks the order: id, type and name, then argument pieces
    assert streamed.finish == "tool_calls" and streamed.content == ""
    (call,) = streamed.calls
    assert call.name == "get_time"
    check_call(served, call.id, call.name, call.arguments)

    whole = ask(served, tool_choice=named, max_tokens=CALL_BUDGET).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        ("get_time", call.arguments)
    ]


@pytest.mark.parametrize("parallel", [False, True], ids=["single", "parallel"])
def test_forced_call_cut_by_max_tokens_never_comes_back_as_content(
    served: FamilyServer, parallel: bool
) -> None:
    """Cut before its JSON closes, a forced call is the call being written (its name, the
    arguments so far) or nothing, finish length, as OpenAI and vLLM answer: never the half-written
    JSON as ordinary content, which a client would show or parse as the answer."""
    options = {"tool_choice": "required", "parallel_tool_calls": parallel, "max_tokens": CUT}
    reply = ask(served, **options)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    assert reply.usage.completion_tokens == CUT
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    for name, arguments in whole:
        assert name in {tool["function"]["name"] for tool in TOOLS}
        with pytest.raises(json.JSONDecodeError):
            json.loads(arguments)  # cut: not yet a whole object
    streamed = read_stream(ask(served, stream=True, **options))
    assert (streamed.content, streamed.finish) == ("", "length")
    assert [(c.name, c.arguments) for c in streamed.calls] == whole


# -- 2. the calls and their results back as history ------------------------------------------


def test_history_round_trip_renders_the_family_syntax(served: FamilyServer) -> None:
    family = served.spec.family
    first = ask(served, tool_choice="required", max_tokens=CALL_BUDGET)
    message = first.choices[0].message.model_dump(exclude_none=True)
    # A second call with an id from elsewhere (another server, an earlier model): Mistral's
    # template takes only 9 alphanumerics, so it is mapped, the same for the call and its result.
    message["tool_calls"].append(
        {
            "id": "call_from_elsewhere_7",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"zone": "CET", "offset": 1}'},
        }
    )
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"answer": n})}
        for n, call in enumerate(message["tool_calls"])
    ]
    history = [*ASK, message, *results]

    then = ask(served, history, max_tokens=8)
    assert then.choices[0].finish_reason in ("stop", "length", "tool_calls")
    ids, text = rendered_prompt(served.session, history, TOOLS)
    assert then.usage.prompt_tokens == len(ids)  # what is checked below is what the server ran

    in_prompt = [template_call_id(call["id"], family) for call in message["tool_calls"]]
    if family == ToolFamily.MISTRAL:
        assert all(CALL_IDS[family].fullmatch(i) for i in in_prompt)
        assert in_prompt[0] == message["tool_calls"][0]["id"]  # the server's own id, as it is
    calls = [
        call_in_prompt(family, i, c["function"]["name"], json.loads(c["function"]["arguments"]))
        for i, c in zip(in_prompt, message["tool_calls"], strict=True)
    ]
    answers = [
        result_in_prompt(family, i, r["content"]) for i, r in zip(in_prompt, results, strict=True)
    ]
    tools_at, calls_at = {
        ToolFamily.HERMES: ("<tools>\n", "<|im_start|>assistant\n"),
        ToolFamily.LLAMA3: ("Environment: ipython\n", "<|eot_id|>"),
        ToolFamily.MISTRAL: ("[AVAILABLE_TOOLS][", "[TOOL_CALLS]["),
    }[family]
    assert_in_order(text, [tools_at, ASK[0]["content"], calls_at, *calls, *answers])

    again = ask(served, history, tool_choice="required", max_tokens=CALL_BUDGET).choices[0]
    assert again.finish_reason == "tool_calls"
    for call in again.message.tool_calls:
        check_call(served, call.id, call.function.name, call.function.arguments)


# -- 3. auto: whatever the model writes ------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_auto_answers_are_the_family_parse_of_what_the_model_wrote(
    served: FamilyServer, seed: int
) -> None:
    options = {"max_tokens": 48, "temperature": 1.0, "seed": seed, "logprobs": True}
    whole = ask(served, **options)
    choice = whole.choices[0]
    wrote = b"".join(bytes(t.bytes) for t in choice.logprobs.content)
    expected = parse_tool_calls(
        wrote.decode("utf-8", "replace"), served.spec.family, parse_tools(TOOLS)
    )
    calls = choice.message.tool_calls or []
    assert (choice.message.content or None) == expected.content
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.name, c.arguments) for c in expected.calls
    ]
    for call in calls:
        assert call.function.name in PARAMS
        assert isinstance(json.loads(call.function.arguments), dict)
    cut = whole.usage.completion_tokens == options["max_tokens"]
    assert choice.finish_reason == ("tool_calls" if calls else "length" if cut else "stop")

    streamed = read_stream(ask(served, stream=True, **options))
    assert streamed.token_bytes == wrote  # the same seed, the same tokens
    assert streamed.content == (choice.message.content or "")
    assert [(c.name, c.arguments) for c in streamed.calls] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert streamed.finish == choice.finish_reason


# -- 4. malformed histories ------------------------------------------------------------------

GOOD_CALL = {
    "id": "abcDEF123",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'},
}


def _with_function(**function: object) -> list[dict]:
    call = {**GOOD_CALL, "function": function}
    return [*ASK, {"role": "assistant", "tool_calls": [call]}]


MALFORMED = {
    "arguments-not-json": (
        _with_function(name="get_weather", arguments="{not json"),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments-an-array": (
        _with_function(name="get_weather", arguments="[1, 2]"),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "call-without-name": (
        _with_function(arguments="{}"),
        "messages[1].tool_calls[0].function.name",
    ),
    "call-without-id": (
        [*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}],
        "messages[1].tool_calls[0].id",
    ),
    "result-for-no-call": (
        [
            *ASK,
            {"role": "assistant", "tool_calls": [GOOD_CALL]},
            {"role": "tool", "tool_call_id": "zzzZZZ999", "content": "21"},
        ],
        "messages[2].tool_call_id",
    ),
}


@pytest.mark.parametrize(("messages", "param"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_history_is_a_400_naming_the_field(
    served: FamilyServer, messages: list, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        ask(served, messages, max_tokens=4)
    error = raised.value
    assert error.status_code == 400
    assert error.param == param
    assert error.body["message"].startswith(param + ": ")


# Histories a family's own template refuses (Qwen 2.5's refuses none).
TEMPLATE_REFUSALS = {
    ToolFamily.LLAMA3: ([{"role": "system", "content": "Be brief."}], "first user message"),
    ToolFamily.MISTRAL: ([*ASK, *ASK], "roles must alternate"),
}


def _refusal(served: FamilyServer) -> openai.BadRequestError:
    refused = TEMPLATE_REFUSALS.get(served.spec.family)
    if refused is None:
        pytest.skip(f"{served.spec.template}'s template refuses no history")
    messages, reason = refused
    with pytest.raises(openai.BadRequestError) as raised:
        ask(served, messages, max_tokens=4)
    assert reason in raised.value.body["message"]
    return raised.value


def test_a_history_the_template_refuses_is_a_400_with_its_reason(served: FamilyServer) -> None:
    error = _refusal(served)
    assert error.status_code == 400 and error.code == "chat_template_error"


def test_a_history_the_template_refuses_names_messages(served: FamilyServer) -> None:
    assert _refusal(served).param == "messages"
