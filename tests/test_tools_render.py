"""localinfer.tools with real chat templates: tools and a whole tool-call history rendered in each
family's own syntax, and a call as the template writes it read back by that family's parser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localinfer.loading.chat_template import ChatTemplate, ChatTemplateError
from localinfer.tools import (
    ToolChoice,
    ToolFamily,
    detect_family,
    new_call_id,
    parse_tool_calls,
    prompt_inputs,
    template_messages,
)
from tests.test_tools_history import TOOLS

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
TOOL_JSON = '"name": "get_weather", "description": "The weather in a city"'


def conversation(call_id: str) -> list[dict]:
    """User, a call, its result, the answer, then a new question (as an OpenAI client sends)."""
    arguments = '{"city": "Paris"}'
    function = {"name": "get_weather", "arguments": arguments}
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": function}]},  # noqa: E501
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 24C"},
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "And in Rome?"},
    ]  # fmt: skip


def render(name: str, call_id: str = "call_abc") -> str:
    source = (TEMPLATES / f"{name}.jinja").read_text()
    family = detect_family(source)
    messages = template_messages(conversation(call_id), family)
    inputs = prompt_inputs(family, messages, TOOLS, ToolChoice("auto"))
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    return template.render(inputs.messages, add_generation_prompt=True, tools=inputs.tools)


def in_order(text: str, *parts: str) -> None:
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after position {at} in:\n{text}"
        at = found + len(part)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B"])
def test_qwen(name):
    text = render(name)
    in_order(
        text,
        "<|im_start|>system\nBe brief.\n\n# Tools",
        f'<tools>\n{{"type": "function", "function": {{{TOOL_JSON}',
        "</tools>",
        "<|im_start|>user\nWeather in Paris?<|im_end|>",
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',  # noqa: E501
        "<|im_start|>user\n<tool_response>\nsunny, 24C\n</tool_response><|im_end|>",
        "<|im_start|>assistant\nIt is sunny in Paris.<|im_end|>",
        "<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n",
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_hermes_3():
    text = render("NousResearch-Hermes-3-Llama-3.1-8B-tool_use")
    in_order(
        text,
        '<tools> {"type": "function", "function": {"name": "get_weather"',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<|im_start|>tool\n<tool_response>\nsunny, 24C\n</tool_response>",
        "It is sunny in Paris.",
    )


LLAMAS = ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct"]


@pytest.mark.parametrize("name", LLAMAS)
def test_llama(name):
    text = render(name)
    in_order(
        text,
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n",
        "Be brief.<|eot_id|>",
        # Llama puts the tools in the first user message, as indented JSON.
        '"name": "get_weather",\n        "description": "The weather in a city"',
        "Weather in Paris?<|eot_id|>",
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',  # noqa: E501
        '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny, 24C"<|eot_id|>',
        "It is sunny in Paris.<|eot_id|>",
        "And in Rome?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    )


@pytest.mark.parametrize("call_id", ["a1B2c3D4e", "call_0123456789abcdef01234567"])
def test_mistral_nemo(call_id):
    text = render("mistralai-Mistral-Nemo-Instruct-2407", call_id)
    ids = re.findall(r'"id": "([^"]*)"', text)
    assert len(ids) == 1 and re.fullmatch(r"[a-zA-Z0-9]{9}", ids[0])
    assert ids[0] == call_id or not call_id.isalnum()
    in_order(
        text,
        "<s>[INST]Weather in Paris?[/INST]",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{ids[0]}"}}]</s>',  # noqa: E501
        f'[TOOL_RESULTS]{{"content": sunny, 24C, "call_id": "{ids[0]}"}}[/TOOL_RESULTS]',
        "It is sunny in Paris.</s>",
        f'[AVAILABLE_TOOLS][{{"type": "function", "function": {{{TOOL_JSON}',
        "[/AVAILABLE_TOOLS][INST]Be brief.\n\nAnd in Rome?[/INST]",
    )


def test_mistral_small_3_2():
    call_id = new_call_id(ToolFamily.MISTRAL)
    text = render("Mistral-Small-3.2-24B-Instruct-2506", call_id)
    in_order(
        text,
        "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT]",
        "[INST]Weather in Paris?[/INST]",
        f'[TOOL_CALLS]get_weather[CALL_ID]{call_id}[ARGS]{{"city": "Paris"}}</s>',
        f"[TOOL_RESULTS]{call_id}[TOOL_CONTENT]sunny, 24C[/TOOL_RESULTS]",
        f'[AVAILABLE_TOOLS][{{"type": "function", "function": {{{TOOL_JSON}',
        "[INST]And in Rome?[/INST]",
    )


@pytest.mark.parametrize("name", ["HuggingFaceTB-SmolLM3-3B", "google-gemma-2-2b-it"])
def test_generic_templates_render_calls_as_text(name):
    if name.startswith("google-gemma-2"):
        # Gemma 2's template refuses system messages, and the generic prompt is one.
        with pytest.raises(ChatTemplateError, match="System role not supported"):
            render(name)
        text = render_without_system(name)
    else:
        text = render(name)
        in_order(text, "Be brief.\n\nYou can call functions", f'{{{TOOL_JSON}, "parameters": ')
    in_order(
        text,
        "Weather in Paris?",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_response name="get_weather">\nsunny, 24C\n</tool_response>',
        "It is sunny in Paris.",
        "And in Rome?",
    )


def render_without_system(name: str) -> str:
    source = (TEMPLATES / f"{name}.jinja").read_text()
    messages = template_messages(conversation("call_1")[1:], ToolFamily.GENERIC)
    return ChatTemplate(source, bos_token="<s>").render(messages)


def test_the_embedded_model_gets_the_generic_prompt():
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    template = load_model(embedded_model_path()).chat_template
    family = detect_family(template.source)
    messages = template_messages(conversation("call_1"), family)
    inputs = prompt_inputs(family, messages, TOOLS, ToolChoice("auto"))
    text = template.render(inputs.messages, tools=inputs.tools)
    in_order(
        text,
        "<|im_start|>system\nBe brief.\n\nYou can call functions",
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather"',
        '<|im_start|>user\n<tool_response name="get_weather">',
    )


# Where each template writes the history's call: the family's parser must read it back.
WRITTEN_CALLS = {
    "Qwen-Qwen2.5-7B-Instruct": r"<tool_call>.*?</tool_call>",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": r"<tool_call>.*?</tool_call>",
    "meta-llama-Llama-3.1-8B-Instruct": r'\{"name": "get_weather", "parameters".*?\}\}',
    "mistralai-Mistral-Nemo-Instruct-2407": r"\[TOOL_CALLS\].*?\]",
    "Mistral-Small-3.2-24B-Instruct-2506": r"\[TOOL_CALLS\].*?\}",
    "HuggingFaceTB-SmolLM3-3B": r"<tool_call>.*?</tool_call>",
}


@pytest.mark.parametrize("name", WRITTEN_CALLS)
def test_a_call_as_the_template_writes_it_is_read_back(name):
    text = render(name, new_call_id(ToolFamily.MISTRAL))
    written = re.findall(WRITTEN_CALLS[name], text, re.DOTALL)[-1]
    family = detect_family((TEMPLATES / f"{name}.jinja").read_text())
    parsed = parse_tool_calls(written, family, TOOLS)
    assert parsed.content is None, written
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city":"Paris"}')]
