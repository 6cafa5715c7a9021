"""The ``tools`` and ``tool_choice`` of an OpenAI chat request, checked and typed.

Every error names the field it concerns (``tools[1].function.name: ...``), so a client can find
its mistake; nothing here depends on the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from localinfer.constraints.compiler import json_schema_problem
from localinfer.errors import InvalidParameterError

# OpenAI's own rule for function names; templates and parsers rely on it (no quotes or tags).
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_TOOLS = 128  # OpenAI's limit; every tool's schema is rendered into the prompt
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """One function a model may call; ``parameters`` is its arguments' JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool

    def as_template_tool(self) -> dict[str, Any]:
        """The tool as Hugging Face chat templates receive it in ``tools``."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """``auto``: the model decides; ``none``: no calls; ``required``: at least one call;
    ``function``: a call of the tool ``name``."""

    mode: Literal["auto", "none", "required", "function"]
    name: str | None = None


def _bad(field: str, message: str) -> InvalidParameterError:
    return InvalidParameterError(f"{field}: {message}")


def _check_name(field: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise _bad(field, "a function name (a non-empty string) is required")
    if not NAME_PATTERN.fullmatch(name):
        raise _bad(
            field,
            f"{name[:80]!r} is not a valid function name (1 to 64 letters, digits, '_' or '-')",
        )
    return name


def _parameters(field: str, value: object) -> dict[str, Any]:
    if value is None:
        return dict(EMPTY_PARAMETERS)
    if not isinstance(value, dict):
        raise _bad(field, f"must be a JSON schema object, not {type(value).__name__}")
    kind = value.get("type", "object")
    if kind != "object":
        raise _bad(field, f"the arguments' schema must have type 'object', not {kind!r}")
    # Checked now whatever tool_choice is: a schema the constraint engine cannot build would
    # otherwise pass under "auto" and fail (naming tool_choice) only once a call is forced.
    problem = json_schema_problem(value)
    if problem is not None:
        raise _bad(field, problem)
    return value


def _one_tool(i: int, tool: object) -> FunctionTool:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise _bad(where, f"must be an object, not {type(tool).__name__}")
    if tool.get("type", "function") != "function":
        raise _bad(f"{where}.type", f"only 'function' tools are supported, not {tool['type']!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{where}.function", "an object with the function's name is required")
    name = _check_name(f"{where}.function.name", function.get("name"))
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{where}.function.description", "must be a string")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"{where}.function.strict", "must be a boolean")
    return FunctionTool(
        name=name,
        description=description or "",
        parameters=_parameters(f"{where}.function.parameters", function.get("parameters")),
        strict=bool(strict),
    )


def parse_tools(tools: list[Any] | None) -> list[FunctionTool]:
    """The request's ``tools``, checked; ``None`` (or an empty list) is no tools."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("tools", f"must be an array, not {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools, not {len(tools)}")
    parsed: list[FunctionTool] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        one = _one_tool(i, tool)
        if one.name in seen:
            raise _bad(f"tools[{i}].function.name", f"duplicate tool name {one.name!r}")
        seen.add(one.name)
        parsed.append(one)
    return parsed


def _named_choice(value: dict[str, Any], tools: list[FunctionTool]) -> ToolChoice:
    if value.get("type") != "function":
        raise _bad(
            "tool_choice",
            f"an object must have type 'function', not {value.get('type')!r}",
        )
    function = value.get("function")
    # The Responses API puts the name at the top level; accept both shapes.
    name = function.get("name") if isinstance(function, dict) else value.get("name")
    if not isinstance(name, str) or not name:
        raise _bad("tool_choice", "the function to call needs a name (function.name)")
    if not tools:
        raise _bad("tool_choice", f"calls {name!r} but the request offers no tools")
    if name not in {t.name for t in tools}:
        raise _bad("tool_choice", f"no tool named {name[:80]!r} in tools")
    return ToolChoice("function", name)


def parse_tool_choice(value: str | dict[str, Any] | None, tools: list[FunctionTool]) -> ToolChoice:
    """The request's ``tool_choice`` against the parsed ``tools``. Left out, it is ``auto`` when
    tools are offered and ``none`` otherwise, as with OpenAI."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise _bad(
                "tool_choice",
                f"{value[:80]!r} is not one of 'auto', 'none', 'required' or a function object",
            )
        if value == "required" and not tools:
            raise _bad("tool_choice", "'required' needs at least one tool in tools")
        if value == "auto" and not tools:
            return ToolChoice("none")
        return ToolChoice(value)  # type: ignore[arg-type]
    if isinstance(value, dict):
        return _named_choice(value, tools)
    raise _bad("tool_choice", f"must be a string or an object, not {type(value).__name__}")
