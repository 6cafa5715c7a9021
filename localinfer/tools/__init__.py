"""OpenAI-style tool calling, framework-free: the request's tools and tool_choice, the model's
call syntax (its template's family), the history and prompt for its chat template, forced calls
as a JSON-schema constraint, and the calls read back out of its answer, whole or streamed.
"""

from __future__ import annotations

from localinfer.tools.family import ToolCall, ToolFamily, detect_family, new_call_id
from localinfer.tools.specs import FunctionTool, ToolChoice, parse_tool_choice, parse_tools
from localinfer.tools.stream import (
    ContentDelta,
    ParsedOutput,
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
    "StreamDelta",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallStart",
    "ToolCallStream",
    "ToolChoice",
    "ToolFamily",
    "detect_family",
    "new_call_id",
    "parse_tool_calls",
    "parse_tool_choice",
    "parse_tools",
]
