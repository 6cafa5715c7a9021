"""OpenAI-style tool calling, framework-free: the request's tools and tool_choice, the model's
call syntax (its template's family), the history and prompt for its chat template, forced calls
as a JSON-schema constraint, and the calls read back out of its answer, whole or streamed.
"""

from __future__ import annotations

from localinfer.tools.family import ToolCall, ToolFamily, detect_family, new_call_id
from localinfer.tools.forced import (
    calls_from_forced,
    forced_call_schema,
    forced_call_spec,
    partial_forced_call,
)
from localinfer.tools.history import template_messages
from localinfer.tools.prompt import PromptInputs, generic_tool_prompt, prompt_inputs
from localinfer.tools.specs import FunctionTool, ToolChoice, parse_tool_choice, parse_tools
from localinfer.tools.stream import (
    ContentDelta,
    ParsedOutput,
    ReasoningDelta,
    StreamDelta,
    ToolCallArguments,
    ToolCallStart,
    ToolCallStream,
    parse_tool_calls,
)

__all__ = [
    "ContentDelta",
    "FunctionTool",
    "ParsedOutput",
    "PromptInputs",
    "ReasoningDelta",
    "StreamDelta",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallStart",
    "ToolCallStream",
    "ToolChoice",
    "ToolFamily",
    "calls_from_forced",
    "detect_family",
    "forced_call_schema",
    "forced_call_spec",
    "generic_tool_prompt",
    "new_call_id",
    "parse_tool_calls",
    "parse_tool_choice",
    "parse_tools",
    "partial_forced_call",
    "prompt_inputs",
    "template_messages",
]
