"""localinfer.tools: the request's tools and tool_choice, template families and call ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localinfer.errors import InvalidParameterError
from localinfer.tools import (
    FunctionTool,
    ToolChoice,
    ToolFamily,
    detect_family,
    new_call_id,
    parse_tool_choice,
    parse_tools,
)
from localinfer.tools.family import template_call_id

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}


def fn(name: str, **function: object) -> dict:
    return {"type": "function", "function": {"name": name, **function}}


def test_parse_tools_reads_each_field():
    tools = parse_tools([WEATHER, fn("now")])
    assert tools[0] == FunctionTool(
        name="get_weather",
        description="The weather in a city",
        parameters=WEATHER["function"]["parameters"],
        strict=True,
    )
    # Left out: no description, arguments an empty object, not strict.
    assert tools[1] == FunctionTool("now", "", {"type": "object", "properties": {}}, False)
    assert tools[1].as_template_tool() == {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
    }
    assert parse_tools(None) == [] and parse_tools([]) == []


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ({"type": "function"}, "tools: must be an array"),
        (["get_weather"], "tools[0]: must be an object"),
        ([{"type": "retrieval"}], "tools[0].type: only 'function'"),
        ([{"type": "function"}], "tools[0].function: "),
        ([fn("")], "tools[0].function.name: a function name"),
        ([fn("get weather")], "tools[0].function.name: 'get weather' is not a valid"),
        ([fn("a" * 65)], "tools[0].function.name: "),
        ([fn("x.y")], "tools[0].function.name: "),
        ([WEATHER, fn("get_weather")], "tools[1].function.name: duplicate tool name"),
        ([fn("f", description=3)], "tools[0].function.description: must be a string"),
        ([fn("f", strict="yes")], "tools[0].function.strict: must be a boolean"),
        ([fn("f", parameters="{}")], "tools[0].function.parameters: must be a JSON schema"),
        ([fn("f", parameters={"type": "array"})], "tools[0].function.parameters: the arg"),
        # checked whatever tool_choice is (it used to pass under "auto" and fail as tool_choice
        # once a call was forced)
        (
            [WEATHER, fn("f", parameters={"type": "object", "properties": {"a": {"type": "x"}}})],
            "tools[1].function.parameters: Invalid type: x",
        ),
        (
            [fn("f", parameters={"type": "object", "properties": {"a": {"pattern": "(x"}}})],
            "tools[0].function.parameters: ",
        ),
        ([fn(f"f{i}") for i in range(129)], "tools: at most 128 tools"),
    ],
)
def test_parse_tools_names_the_bad_field(tools, field):
    with pytest.raises(InvalidParameterError) as err:
        parse_tools(tools)
    assert str(err.value).startswith(field)


def test_tools_with_keywords_the_engine_does_not_implement_still_pass():
    """Agents' tool lists use them; they worked under tool_choice auto before the up-front
    check and still do (a forced call compiles strictly and names tool_choice)."""
    loose = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "host": {"type": "string", "format": "hostname-xyz"},
            "name": {"type": "string", "not": {"const": "root"}},
        },
    }
    assert parse_tools([fn("f", parameters=loose)])[0].parameters == loose


def test_tool_choice():
    tools = parse_tools([WEATHER])
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice(None, []) == ToolChoice("none")
    assert parse_tool_choice("auto", []) == ToolChoice("none")
    for mode in ("auto", "none", "required"):
        assert parse_tool_choice(mode, tools) == ToolChoice(mode)
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse_tool_choice(named, tools) == ToolChoice("function", "get_weather")
    responses_api = {"type": "function", "name": "get_weather"}
    assert parse_tool_choice(responses_api, tools) == ToolChoice("function", "get_weather")


@pytest.mark.parametrize(
    ("value", "tools", "message"),
    [
        ("sometimes", [WEATHER], "is not one of"),
        ("required", [], "'required' needs at least one tool"),
        ({"type": "function", "function": {"name": "other"}}, [WEATHER], "no tool named 'other'"),
        ({"type": "function", "function": {"name": "get_weather"}}, [], "offers no tools"),
        ({"type": "function", "function": {}}, [WEATHER], "needs a name"),
        ({"type": "allowed_tools"}, [WEATHER], "must have type 'function'"),
        (3, [WEATHER], "must be a string or an object"),
    ],
)
def test_tool_choice_errors_name_the_field(value, tools, message):
    with pytest.raises(InvalidParameterError) as err:
        parse_tool_choice(value, parse_tools(tools))
    assert str(err.value).startswith("tool_choice: ") and message in str(err.value)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Qwen-Qwen2.5-7B-Instruct", ToolFamily.HERMES),
        ("Qwen-Qwen3-0.6B", ToolFamily.HERMES),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolFamily.HERMES),
        ("meta-llama-Llama-3.1-8B-Instruct", ToolFamily.LLAMA3),
        ("meta-llama-Llama-3.2-3B-Instruct", ToolFamily.LLAMA3),
        ("mistralai-Mistral-Nemo-Instruct-2407", ToolFamily.MISTRAL),
        ("Mistral-Small-3.2-24B-Instruct-2506", ToolFamily.MISTRAL),
        # This SmolLM3 template (Unsloth's) renders tool messages but never the tools.
        ("HuggingFaceTB-SmolLM3-3B", ToolFamily.GENERIC),
        ("google-gemma-2-2b-it", ToolFamily.GENERIC),
    ],
)
def test_detect_family_of_real_templates(name, family):
    assert detect_family((TEMPLATES / f"{name}.jinja").read_text()) == family


def test_detect_family_of_the_embedded_model_and_of_no_template():
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    template = load_model(embedded_model_path()).chat_template
    assert "<|im_start|>" in template.source  # SmolLM2's ChatML, no tools
    assert detect_family(template.source) == ToolFamily.GENERIC
    assert detect_family(None) == ToolFamily.GENERIC
    assert detect_family("") == ToolFamily.GENERIC


def test_call_syntaxes_not_parsed_here_are_generic():
    # GLM / Qwen3-Coder style: <tool_call> with XML arguments, not JSON.
    glm = "{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>"
    coder = "<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>"
    assert detect_family(glm) == ToolFamily.GENERIC
    assert detect_family(coder) == ToolFamily.GENERIC


def test_call_ids():
    ids = {new_call_id(ToolFamily.HERMES) for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
    mistral = {new_call_id(ToolFamily.MISTRAL) for _ in range(50)}
    assert len(mistral) == 50 and all(re.fullmatch(r"[a-zA-Z0-9]{9}", i) for i in mistral)


def test_history_ids_are_mapped_for_mistral_only():
    foreign = "call_0123456789abcdef01234567"
    mapped = template_call_id(foreign, ToolFamily.MISTRAL)
    assert re.fullmatch(r"[a-zA-Z0-9]{9}", mapped)
    assert template_call_id(foreign, ToolFamily.MISTRAL) == mapped  # call and result agree
    assert template_call_id("call_other", ToolFamily.MISTRAL) != mapped
    assert template_call_id("abcDEF123", ToolFamily.MISTRAL) == "abcDEF123"
    assert template_call_id(foreign, ToolFamily.HERMES) == foreign
