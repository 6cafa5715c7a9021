"""What the chat template gets for a request with tools.

A template with tool support receives them in ``tools`` (Hugging Face's shape) and writes them
into the prompt its own way. A template without (GENERIC) gets a system prompt that lists the
tools and teaches the ``<tool_call>`` syntax, which stream.py then reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localinfer.tools.family import ToolFamily
from localinfer.tools.specs import FunctionTool, ToolChoice

GENERIC_INSTRUCTIONS = """\
You can call functions (tools) to help answer. The available tools, one JSON object per line:
{tool_lines}

To call a tool, answer with a <tool_call></tool_call> block holding a JSON object with the \
tool's name and its arguments (one block per call, nothing else in the answer):
<tool_call>
{{"name": "<tool name>", "arguments": {{"<argument>": <value>}}}}
</tool_call>
The results come back in <tool_response></tool_response> blocks. {when}"""


@dataclass(frozen=True)
class PromptInputs:
    """The chat template's ``messages`` and ``tools`` (None: render without tools)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def generic_tool_prompt(tools: list[FunctionTool], choice: ToolChoice) -> str:
    """The system text that offers ``tools`` to a model whose template has no tool support."""
    lines = "\n".join(
        json.dumps(
            {"name": t.name, "description": t.description, "parameters": t.parameters},
            ensure_ascii=False,
        )
        for t in tools
    )
    if choice.mode == "function":
        when = f"Call the tool {choice.name} now."
    elif choice.mode == "required":
        when = "Call at least one tool now."
    else:
        when = "When no tool is needed, answer normally."
    return GENERIC_INSTRUCTIONS.format(tool_lines=lines, when=when)


def prompt_inputs(
    family: ToolFamily,
    messages: list[dict[str, Any]],
    tools: list[FunctionTool],
    choice: ToolChoice,
) -> PromptInputs:
    """``messages``: the history as ``template_messages`` returned it for ``family``."""
    if not tools or choice.mode == "none":
        return PromptInputs(list(messages), None)
    if family == ToolFamily.HARMONY:
        # gpt-oss's template writes every tool's description, and fails on one without.
        described = [t.as_template_tool() for t in tools]
        for tool in described:
            tool["function"].setdefault("description", "")
        return PromptInputs(list(messages), described)
    if family != ToolFamily.GENERIC:
        return PromptInputs(list(messages), [t.as_template_tool() for t in tools])
    instructions = generic_tool_prompt(tools, choice)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        merged = f"{first['content']}\n\n{instructions}" if first["content"] else instructions
        return PromptInputs([{**first, "content": merged}, *messages[1:]], None)
    return PromptInputs([{"role": "system", "content": instructions}, *messages], None)
