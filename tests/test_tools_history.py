"""localinfer.tools: OpenAI histories with tool calls, checked and converted for chat templates,
and the prompt inputs for each family (rendering with real templates: test_tools_render)."""

from __future__ import annotations

import copy
import re

import pytest

from localinfer.errors import InvalidParameterError
from localinfer.tools import (
    PromptInputs,
    ToolChoice,
    ToolFamily,
    parse_tool_calls,
    parse_tools,
    prompt_inputs,
    template_messages,
)

H, L, M, G = ToolFamily.HERMES, ToolFamily.LLAMA3, ToolFamily.MISTRAL, ToolFamily.GENERIC
TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
)


def call(call_id: str, city: str) -> dict:
    arguments = f'{{"city": "{city}"}}'
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


def history(first_id: str = "call_1", second_id: str = "call_2") -> list[dict]:
    """As a client sends it: a parallel call, its two results, the answer, a new question."""
    return [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in "},
                {"type": "text", "text": "Paris and Rome?"},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call(first_id, "Paris"), call(second_id, "Rome")],
        },
        {"role": "tool", "tool_call_id": first_id, "content": "sunny, 24C"},
        {
            "role": "tool",
            "tool_call_id": second_id,
            "content": [{"type": "text", "text": "rain, 18C"}],
        },
        {"role": "assistant", "content": "Paris is sunny; Rome has rain."},
        {"role": "user", "content": "Thanks!"},
    ]


def hf_call(call_id: str, city: str) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": city}},
    }


def test_native_families_get_hugging_face_messages():
    assert template_messages(history(), H) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [hf_call("call_1", "Paris"), hf_call("call_2", "Rome")],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny, 24C"},
        {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "rain, 18C"},
        {"role": "assistant", "content": "Paris is sunny; Rome has rain."},
        {"role": "user", "content": "Thanks!"},
    ]


def test_the_input_is_not_changed_and_converting_twice_changes_nothing():
    sent = history()
    kept = copy.deepcopy(sent)
    once = template_messages(sent, H)
    assert sent == kept
    assert template_messages(once, H) == once


def test_llama_gets_one_call_per_assistant_turn():
    # Llama 3's templates raise on an assistant turn with more than one call.
    out = template_messages(history(), L)
    turns = [m for m in out if m["role"] == "assistant" and "tool_calls" in m]
    assert [t["tool_calls"] for t in turns] == [
        [hf_call("call_1", "Paris")],
        [hf_call("call_2", "Rome")],
    ]
    assert all("tool_calls" not in m for m in out if m["role"] != "assistant")


def test_mistral_ids_become_nine_alphanumerics_consistently():
    out = template_messages(history("call_0123456789abcdef01234567", "a1B2c3D4e"), M)
    first, second = out[2]["tool_calls"]
    assert re.fullmatch(r"[a-zA-Z0-9]{9}", first["id"]) and second["id"] == "a1B2c3D4e"
    assert [out[3]["tool_call_id"], out[4]["tool_call_id"]] == [first["id"], second["id"]]


def test_generic_family_writes_calls_and_results_as_text():
    out = template_messages(history(), G)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert all(set(m) == {"role", "content"} for m in out)
    assert out[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    assert out[3]["content"] == (
        '<tool_response name="get_weather">\nsunny, 24C\n</tool_response>\n\n'
        '<tool_response name="get_weather">\nrain, 18C\n</tool_response>'
    )
    # The calls are written in the syntax the generic parser reads.
    parsed = parse_tool_calls(out[2]["content"], G, TOOLS)
    assert parsed.content is None
    assert [c.arguments for c in parsed.calls] == ['{"city":"Paris"}', '{"city":"Rome"}']


def test_generic_results_and_a_following_question_share_one_user_turn():
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call("c1", "Paris")]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    out = template_messages(messages, G)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1]["content"].startswith("Let me check.\n<tool_call>\n")
    assert out[2]["content"].endswith("</tool_response>\n\nAnd tomorrow?")


def test_empty_arguments_and_arguments_already_objects_are_accepted():
    messages = [
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "now", "arguments": ""}},
                {"id": "b", "function": {"name": "now", "arguments": {"tz": "UTC"}}},
            ],
        },
    ]
    calls = template_messages(messages, H)[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{}, {"tz": "UTC"}]


def with_change(index: int, **fields: object) -> list[dict]:
    messages = history()
    messages[index] = {**messages[index], **fields}
    return messages


def with_call(**function: object) -> list[dict]:
    messages = history()
    messages[2] = {
        **messages[2],
        "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
    }
    return messages[:4]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hello", "messages: must be an array"),
        (["hello"], "messages[0]: must be an object"),
        (with_change(0, role="robot"), "messages[0].role: 'robot' is not one of"),
        (with_change(1, content=None), "messages[1].content: a user message needs content"),
        (with_change(1, content=3), "messages[1].content: must be a string or an array"),
        (
            with_change(1, content=[{"type": "image_url"}]),
            "messages[1].content[0]: only text parts",
        ),
        (
            with_change(1, content=[{"type": "text"}]),
            "messages[1].content[0].text: must be a string",
        ),
        (with_change(2, tool_calls={"id": "x"}), "messages[2].tool_calls: must be an array"),
        (with_change(2, tool_calls=["x"]), "messages[2].tool_calls[0]: must be an object"),
        (
            with_change(2, tool_calls=[{"type": "code", "id": "x"}]),
            "messages[2].tool_calls[0].type: ",
        ),
        (
            with_change(2, tool_calls=[{"function": {"name": "f"}}]),
            "messages[2].tool_calls[0].id: ",
        ),
        (with_change(2, tool_calls=[{"id": "x"}]), "messages[2].tool_calls[0].function: "),
        (with_call(arguments="{}"), "messages[2].tool_calls[0].function.name: "),
        (
            with_call(name="get_weather", arguments="{city: Paris}"),
            "messages[2].tool_calls[0].function.arguments: not valid JSON",
        ),
        (
            with_call(name="get_weather", arguments="[1, 2]"),
            "messages[2].tool_calls[0].function.arguments: must be a JSON object",
        ),
        (
            with_call(name="get_weather", arguments=7),
            "messages[2].tool_calls[0].function.arguments: must be a JSON object",
        ),
        (with_change(3, tool_call_id="call_9"), "messages[3].tool_call_id: no earlier tool call"),
        (with_change(3, tool_call_id=None), "messages[3].tool_call_id: a tool message needs"),
        (with_change(3, content=None), "messages[3].content: a tool message needs content"),
        # A result can only answer a call made before it.
        ([history()[3], *history()], "messages[0].tool_call_id: no earlier tool call"),
    ],
)
def test_malformed_histories_name_the_field(messages, message):
    with pytest.raises(InvalidParameterError) as err:
        template_messages(messages, H)
    assert str(err.value).startswith(message)


def test_prompt_inputs_for_native_families():
    messages = template_messages(history(), H)
    inputs = prompt_inputs(H, messages, TOOLS, ToolChoice("auto"))
    assert inputs == PromptInputs(messages, [TOOLS[0].as_template_tool()])
    assert inputs.tools[0]["function"]["name"] == "get_weather"
    for choice in (ToolChoice("required"), ToolChoice("function", "get_weather")):
        assert prompt_inputs(M, messages, TOOLS, choice).tools == inputs.tools
    assert prompt_inputs(H, messages, TOOLS, ToolChoice("none")) == PromptInputs(messages, None)
    assert prompt_inputs(L, messages, [], ToolChoice("none")) == PromptInputs(messages, None)


def test_generic_prompt_joins_the_system_message_or_comes_first():
    messages = template_messages(history(), G)
    inputs = prompt_inputs(G, messages, TOOLS, ToolChoice("auto"))
    assert inputs.tools is None and inputs.messages[1:] == messages[1:]
    system = inputs.messages[0]["content"]
    assert system.startswith("Be brief.\n\nYou can call functions")
    assert (
        '{"name": "get_weather", "description": "The weather in a city", "parameters": ' in system
    )
    assert "<tool_call>" in system and "When no tool is needed, answer normally." in system

    alone = prompt_inputs(G, messages[1:], TOOLS, ToolChoice("function", "get_weather"))
    assert alone.messages[0]["role"] == "system" and alone.messages[1:] == messages[1:]
    assert alone.messages[0]["content"].endswith("Call the tool get_weather now.")
    required = prompt_inputs(G, messages[1:], TOOLS, ToolChoice("required"))
    assert required.messages[0]["content"].endswith("Call at least one tool now.")
    assert prompt_inputs(G, messages, TOOLS, ToolChoice("none")) == PromptInputs(messages, None)
