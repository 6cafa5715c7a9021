"""OpenAI-style tool calling, framework-free: the request's tools and tool_choice, the model's
call syntax (its template's family), the history and prompt for its chat template, forced calls
as a JSON-schema constraint, and the calls read back out of its answer, whole or streamed.
"""

from __future__ import annotations

from localinfer.tools.family import ToolCall, ToolFamily, detect_family, new_call_id
from localinfer.tools.specs import FunctionTool, ToolChoice, parse_tool_choice, parse_tools

__all__ = [
    "FunctionTool",
    "ToolCall",
    "ToolChoice",
    "ToolFamily",
    "detect_family",
    "new_call_id",
    "parse_tool_choice",
    "parse_tools",
]
