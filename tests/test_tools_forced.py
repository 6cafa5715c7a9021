"""localinfer.tools: tool_choice required / a named function as a JSON-schema constraint, compiled
with llguidance over the embedded model's real vocabulary, and the calls read back."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from localinfer.constraints import TokenRefusedError  # noqa: E402
from localinfer.errors import InvalidParameterError  # noqa: E402
from localinfer.tools import (  # noqa: E402
    ToolChoice,
    ToolFamily,
    calls_from_forced,
    forced_call_schema,
    forced_call_spec,
    parse_tools,
)
from tests import test_constraints as walks  # noqa: E402
from tests.test_constraints import answer_text, greedy_walk  # noqa: E402

# The embedded model's tokenizer, its compiler and the walk's leanings, shared with those tests.
tokenizer, compiler, leanings = walks.tokenizer, walks.compiler, walks.leanings

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
# As pydantic writes a model with a nested one: the nested schema under $defs, reached by $ref.
EVENT = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "where": {"$ref": "#/$defs/Place"},
        "attendees": {"type": "array", "items": {"$ref": "#/$defs/Person"}, "maxItems": 2},
    },
    "required": ["title", "where", "attendees"],
    "additionalProperties": False,
    "$defs": {
        "Place": {
            "type": "object",
            "properties": {"room": {"type": "integer"}},
            "required": ["room"],
            "additionalProperties": False,
        },
        "Person": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
}
TOOLS = parse_tools(
    [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "add_event", "parameters": EVENT}},
        {"type": "function", "function": {"name": "now"}},
    ]
)
REQUIRED, ADD_EVENT = ToolChoice("required"), ToolChoice("function", "add_event")
WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
EVENT_CALL = {
    "name": "add_event",
    "arguments": {"title": "Sync", "where": {"room": 4}, "attendees": [{"name": "Ada"}]},
}
NOW_CALL = {"name": "now", "arguments": {}}


def valid(schema: dict, value: object) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_schema_shapes():
    one = forced_call_schema(TOOLS, ToolChoice("function", "get_weather"), parallel=True)
    assert one == {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    anyof = forced_call_schema(TOOLS, REQUIRED, parallel=False)
    assert [c["properties"]["name"]["const"] for c in anyof["anyOf"]] == [t.name for t in TOOLS]
    array = forced_call_schema(TOOLS, REQUIRED, parallel=True)
    assert array["type"] == "array" and array["minItems"] == 1
    spec = forced_call_spec(TOOLS, REQUIRED, parallel=False)
    assert (spec.kind, spec.field, spec.schema()) == ("json_schema", "tool_choice", anyof)
    for mode in ("auto", "none"):
        with pytest.raises(ValueError):
            forced_call_schema(TOOLS, ToolChoice(mode), parallel=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("choice", "parallel", "good", "bad"),
    [
        (
            ToolChoice("function", "get_weather"),
            False,
            [WEATHER_CALL],
            [
                NOW_CALL,  # another tool
                {"name": "get_weather", "arguments": {"city": "Paris"}},  # a required argument
                {"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}},
                {**WEATHER_CALL, "id": "x"},  # nothing else
                [WEATHER_CALL],  # one call, not an array
            ],
        ),
        (
            ADD_EVENT,
            False,
            [EVENT_CALL],
            [
                {
                    "name": "add_event",
                    "arguments": {**EVENT_CALL["arguments"], "where": {"room": "4"}},
                },
                {"name": "add_event", "arguments": {**EVENT_CALL["arguments"], "attendees": [{}]}},
            ],
        ),
        (
            REQUIRED,
            False,
            [WEATHER_CALL, EVENT_CALL, NOW_CALL],
            [
                {"name": "rm", "arguments": {}},
                {"name": "now"},
                [NOW_CALL],
            ],
        ),
        (
            REQUIRED,
            True,
            [[WEATHER_CALL], [NOW_CALL, EVENT_CALL, NOW_CALL]],
            [
                [],
                WEATHER_CALL,
                [WEATHER_CALL, {"name": "rm", "arguments": {}}],
            ],
        ),
    ],
)
def test_the_constraint_takes_valid_calls_and_refuses_others(
    choice, parallel, good, bad, compiler, tokenizer
):
    schema = forced_call_schema(TOOLS, choice, parallel)
    compiled = compiler.compile(forced_call_spec(TOOLS, choice, parallel))
    for value in good:
        text = json.dumps(value)
        assert valid(schema, value) and accepts(compiled, tokenizer, text), text
        expected = []  # a call repeated word for word is kept once
        for v in value if isinstance(value, list) else [value]:
            if (v["name"], v["arguments"]) not in expected:
                expected.append((v["name"], v["arguments"]))
        calls = calls_from_forced(text, parallel, ToolFamily.HERMES)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
    for value in bad:
        text = json.dumps(value)
        assert not valid(schema, value) and not accepts(compiled, tokenizer, text), text


def accepts(compiled, tokenizer, text: str) -> bool:
    """Whether the constraint takes ``text`` token by token and finds it a whole answer."""
    constraint = compiled.start()
    try:
        for token in tokenizer.encode(text, parse_special=False):
            constraint.advance(token)
    except TokenRefusedError:
        return False
    return constraint.is_complete()


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [
        (REQUIRED, False),
        (REQUIRED, True),
        (ADD_EVENT, True),
        (ToolChoice("function", "now"), False),
    ],
)
def test_walks_under_the_constraint_give_valid_calls(
    choice, parallel, compiler, tokenizer, leanings
):
    arguments_schema = {t.name: t.parameters for t in TOOLS}
    compiled = compiler.compile(forced_call_spec(TOOLS, choice, parallel))
    for seed in range(4):
        scores = np.random.default_rng(seed).random(tokenizer.vocab_size)
        text = answer_text(tokenizer, greedy_walk(compiled.start(), scores, leanings))
        calls = calls_from_forced(text, parallel, ToolFamily.MISTRAL)
        assert calls, text
        for call in calls:
            assert choice.mode == "required" or call.name == choice.name
            assert valid(arguments_schema[call.name], json.loads(call.arguments)), text
            assert re.fullmatch(r"[a-zA-Z0-9]{9}", call.id)


def test_recursive_and_nested_references_move_with_the_tool(compiler, tokenizer):
    tree = {
        "type": "object",
        "properties": {"root": {"$ref": "#/definitions/Node"}, "copy": {"$ref": "#"}},
        "definitions": {
            "Node": {
                "type": "object",
                "properties": {
                    "children": {"type": "array", "items": {"$ref": "#/definitions/Node"}}
                },
            }
        },
    }
    tools = parse_tools([{"type": "function", "function": {"name": "tree", "parameters": tree}}])
    schema = forced_call_schema(tools, REQUIRED, parallel=False)
    compiled = compiler.compile(forced_call_spec(tools, REQUIRED, parallel=False))
    good = {"name": "tree", "arguments": {"root": {"children": [{"children": []}]}, "copy": {}}}
    bad = {"name": "tree", "arguments": {"root": {"children": [{"children": 3}]}}}
    assert valid(schema, good) and accepts(compiled, tokenizer, json.dumps(good))
    assert not valid(schema, bad) and not accepts(compiled, tokenizer, json.dumps(bad))


def test_a_schema_the_engine_cannot_build_names_its_tool():
    """Refused when the tools are read, whatever tool_choice is (it used to pass under "auto"
    and fail naming tool_choice once a call was forced)."""
    broken = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(x"}}}
    with pytest.raises(InvalidParameterError, match=r"^tools\[0\]\.function\.parameters: "):
        parse_tools([{"type": "function", "function": {"name": "f", "parameters": broken}}])


def test_a_forced_call_the_engine_cannot_build_names_tool_choice(compiler):
    """A keyword llguidance does not implement passes when the tools are read (lenient, as
    under tool_choice auto) but cannot constrain a forced call: a 400 naming tool_choice."""
    loose = {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": loose}}])
    with pytest.raises(InvalidParameterError, match=r"^tool_choice: .*not"):
        compiler.compile(forced_call_spec(tools, REQUIRED, parallel=False))


def test_reading_forced_answers_back():
    one = json.dumps(WEATHER_CALL)
    assert [c.name for c in calls_from_forced(one, False, ToolFamily.HERMES)] == ["get_weather"]
    assert [c.name for c in calls_from_forced(one, True, ToolFamily.HERMES)] == ["get_weather"]
    both = json.dumps([WEATHER_CALL, NOW_CALL])
    assert [c.name for c in calls_from_forced(both, True, ToolFamily.HERMES)] == [
        "get_weather",
        "now",
    ]  # noqa: E501
    call = calls_from_forced(one, False, ToolFamily.LLAMA3)[0]
    assert call.arguments == '{"city":"Paris","unit":"celsius"}' and call.id.startswith("call_")
    # Cut short by max_tokens, or not the shape asked for: no calls (the text goes back as content).
    assert calls_from_forced(one[:-3], False, ToolFamily.HERMES) == []
    assert calls_from_forced(both, False, ToolFamily.HERMES) == []
    assert calls_from_forced('{"name": "now"}', False, ToolFamily.HERMES) == []
    assert calls_from_forced("[1]", True, ToolFamily.HERMES) == []


def test_forced_parallel_calls_are_deduplicated_and_salvaged_when_cut() -> None:
    from localinfer.tools import ToolFamily, calls_from_forced

    one = '{"name": "f", "arguments": {"x": 1}}'
    two = '{"name": "f", "arguments": {"x": 2}}'
    whole = f"[{one}, {two}, {one}]"
    calls = calls_from_forced(whole, True, ToolFamily.HERMES)
    assert [c.arguments for c in calls] == ['{"x":1}', '{"x":2}']
    cut = f"[\n{one},\n{two},\n" + '{"name": "f", "argu'
    assert calls_from_forced(cut, True, ToolFamily.HERMES) == []
    salvaged = calls_from_forced(cut, True, ToolFamily.HERMES, cut=True)
    assert [c.arguments for c in salvaged] == ['{"x":1}', '{"x":2}']
    assert calls_from_forced('{"name": "f", "argu', False, ToolFamily.HERMES, cut=True) == []


def test_forced_calls_and_strict_schemas_are_compact_json(compiler, tokenizer) -> None:
    """A forced call is json.dumps' own spacing, nothing more: no newline, no run of spaces the
    model could spend its max_tokens on. A strict response_format is the same; a loose one takes
    short runs of whitespace between tokens."""
    from localinfer.server.structured_output import ResponseFormat, response_format_spec

    compiled = compiler.compile(forced_call_spec(TOOLS, REQUIRED, parallel=True))
    assert accepts(compiled, tokenizer, json.dumps([WEATHER_CALL, NOW_CALL]))
    pretty = json.dumps([WEATHER_CALL], indent=1)
    for text in (
        pretty,
        "[ " + json.dumps(WEATHER_CALL) + "]",
        json.dumps([WEATHER_CALL])[:-1] + "\n]",
    ):
        assert not accepts(compiled, tokenizer, text), text

    def response_format(strict: bool | None):
        wrapper = {"name": "w", "schema": WEATHER, "strict": strict}
        spec = response_format_spec(ResponseFormat(type="json_schema", json_schema=wrapper))
        return compiler.compile(spec)

    arguments = WEATHER_CALL["arguments"]
    assert accepts(response_format(True), tokenizer, json.dumps(arguments))
    assert not accepts(response_format(True), tokenizer, json.dumps(arguments, indent=2))
    assert accepts(response_format(None), tokenizer, json.dumps(arguments, indent=2))
    assert not accepts(response_format(None), tokenizer, "{" + " " * 17 + '"city": "x"}')


def test_a_cut_forced_call_keeps_its_name_and_the_arguments_so_far() -> None:
    from localinfer.tools import partial_forced_call

    cut = '[{"name": "get_weather", "arguments": {"city": "Pa'
    call = partial_forced_call(cut, ToolFamily.HERMES)
    assert call is not None and (call.name, call.arguments) == ("get_weather", '{"city": "Pa')
    # The arguments whole, only the call's closing brace cut: they are read as the object.
    call = partial_forced_call('{"name": "f", "arguments": {"x": 1}', ToolFamily.HERMES)
    assert call is not None and (call.name, call.arguments) == ("f", '{"x":1}')
    call = partial_forced_call('{"name": "f", "argu', ToolFamily.HERMES)
    assert call is not None and (call.name, call.arguments) == ("f", "")
    assert partial_forced_call('[{"name": "get_wea', ToolFamily.HERMES) is None
    assert partial_forced_call("", ToolFamily.HERMES) is None
