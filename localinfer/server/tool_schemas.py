"""Function tools and ``tool_choice`` as chat completions and the Responses API take them, typed so
that /openapi.json states what the server accepts: function tools with OpenAI's names, and
``auto``, ``none``, ``required`` or the function to call, each in its API's shape.
``localinfer.tools`` (``parse_tools``, ``parse_tool_choice``) then checks them against each other
and the constraint engine; what it refuses that no schema can state (a choice naming a tool the
request lacks, two tools of one name, a parameters schema the engine cannot build) stays a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, WithJsonSchema

# localinfer.tools.specs.NAME_PATTERN (OpenAI's rule for function names), as the document says it.
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_TOOLS = 128  # localinfer.tools.specs.MAX_TOOLS

# A function's arguments, as a JSON schema: an object's (``parse_tools`` refuses another type),
# with the keywords the constraint engine checks in it (json_schema_problem) stated as it checks
# them: a subschema is an object or a boolean, a type one of JSON's.
JSON_TYPES = ["object", "array", "string", "number", "integer", "boolean", "null"]
_TYPE = {"anyOf": [{"enum": JSON_TYPES}, {"type": "array", "items": {"enum": JSON_TYPES}}]}
_SUBSCHEMA = {"type": ["object", "boolean"], "properties": {"type": _TYPE}}
PARAMETERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The JSON schema of the function's arguments: an object's",
    "properties": {
        "type": {"const": "object"},
        "properties": {"type": "object", "additionalProperties": _SUBSCHEMA},
        "required": {"type": "array", "items": {"type": "string"}},
        "additionalProperties": _SUBSCHEMA,
    },
}
Parameters = Annotated[dict[str, Any], WithJsonSchema(PARAMETERS_SCHEMA)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionSpec(_Part):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: Parameters | None = None
    strict: StrictBool | None = None


class ChatTool(_Part):
    """Chat completions' ``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class FlatTool(FunctionSpec):
    """The Responses API's function tool: ``{"type": "function", name, description, ...}``."""

    type: Literal["function"]


ChatTools = Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)]


class FunctionName(_Part):
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(_Part):
    """Chat completions' ``{"type": "function", "function": {"name": ...}}``: call that tool."""

    type: Literal["function"]
    function: FunctionName


class FlatToolChoice(_Part):
    """The Responses API's ``{"type": "function", "name": ...}``: a call of that tool."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)


ToolChoiceMode = Literal["auto", "none", "required"]
ChatToolChoice = ToolChoiceMode | NamedToolChoice
ResponsesToolChoice = ToolChoiceMode | FlatToolChoice

# "required" or a named function needs tools (the bodies' validators, ``choice_needs_tools``,
# and parse_tool_choice refuse it); the document says so.
NEEDS_TOOLS: dict[str, Any] = {
    "if": {
        "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
        "required": ["tool_choice"],
    },
    "then": {
        "properties": {"tools": {"type": "array", "minItems": 1}},
        "required": ["tools"],
    },
}


def choice_needs_tools(
    choice: ChatToolChoice | ResponsesToolChoice | None, tools: list[Any] | None
) -> None:
    """ValueError naming ``tool_choice`` when it asks for a call and no tool is offered."""
    if tools or choice is None or choice in ("auto", "none"):
        return
    if choice == "required":
        raise ValueError("tool_choice: 'required' needs at least one tool in tools")
    raise ValueError("tool_choice: calls a function but the request offers no tools")


def tool_dicts(tools: list[ChatTool] | None) -> list[dict[str, Any]] | None:
    """The tools as ``parse_tools`` reads them."""
    return None if tools is None else [tool.model_dump(exclude_none=True) for tool in tools]


def choice_value(
    choice: ChatToolChoice | ResponsesToolChoice | None,
) -> str | dict[str, Any] | None:
    """The choice as ``parse_tool_choice`` reads it (chat's shape for a named function)."""
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "function": {"name": choice.function.name}}
    if isinstance(choice, FlatToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice
