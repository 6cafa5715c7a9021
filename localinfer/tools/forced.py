"""``tool_choice`` required or a named function: the answer is constrained to JSON calls.

The constraint is a JSON schema of one call, ``{"name": <a tool's name>, "arguments": <that
tool's parameters>}`` (``anyOf`` over the tools for ``required``), or with parallel calls an array
of at least one. The answer is then plain JSON whatever the model's own call syntax, and is read
back with ``calls_from_forced``; an answer cut short before its first call is whole is read with
``partial_forced_call``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localinfer.constraints import ConstraintSpec
from localinfer.tools.call_json import arguments_text, decode_at, loads
from localinfer.tools.family import ToolCall, ToolFamily, new_call_id
from localinfer.tools.specs import FunctionTool, ToolChoice

_DEF_KEYS = ("$defs", "definitions")
# Parallel calls per answer: a small model that loops on "," after each call stops here.
MAX_PARALLEL_CALLS = 8


def _rewrite_refs(value: Any, prefix: str) -> Any:
    """``value`` with each local ``$ref`` re-pointed at the tool's place under the root's
    ``$defs`` (a tool's schema is nested in the call schema, so ``#/...`` must move)."""
    if isinstance(value, list):
        return [_rewrite_refs(v, prefix) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _rewrite_refs(v, prefix) for k, v in value.items()}
    ref = value.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        pointer = ref[1:]
        for key in _DEF_KEYS:
            if pointer.startswith(f"/{key}/"):
                out["$ref"] = f"#/$defs/{prefix}_{pointer[len(key) + 2 :]}"
                break
        else:
            out["$ref"] = f"#/$defs/{prefix}{pointer}"
    return out


def _has_ref(value: Any) -> bool:
    if isinstance(value, dict):
        return "$ref" in value or any(_has_ref(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_ref(v) for v in value)
    return False


def _arguments_schema(index: int, tool: FunctionTool, defs: dict[str, Any]) -> dict[str, Any]:
    """The tool's parameters, as they can sit inside the call schema."""
    if not _has_ref(tool.parameters):
        return tool.parameters
    prefix = f"tool{index}"
    body = {k: v for k, v in tool.parameters.items() if k not in _DEF_KEYS}
    defs[prefix] = _rewrite_refs(body, prefix)
    for key in _DEF_KEYS:
        for name, schema in (tool.parameters.get(key) or {}).items():
            defs[f"{prefix}_{name}"] = _rewrite_refs(schema, prefix)
    return {"$ref": f"#/$defs/{prefix}"}


def _call_schema(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forced_call_schema(tools: list[FunctionTool], choice: ToolChoice, parallel: bool) -> dict:
    """The JSON schema behind ``forced_call_spec``."""
    if choice.mode not in ("required", "function"):
        raise ValueError(f"tool_choice {choice.mode!r} does not force a call")
    chosen = [
        (i, t) for i, t in enumerate(tools) if choice.mode == "required" or t.name == choice.name
    ]
    if not chosen:
        raise ValueError("no tool to force")
    defs: dict[str, Any] = {}
    calls = [_call_schema(t.name, _arguments_schema(i, t, defs)) for i, t in chosen]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel and choice.mode == "required":
        schema = {
            "type": "array",
            "items": schema,
            "minItems": 1,
            "maxItems": MAX_PARALLEL_CALLS,
        }
    return {**schema, "$defs": defs} if defs else schema


def forced_call_spec(
    tools: list[FunctionTool], choice: ToolChoice, parallel: bool
) -> ConstraintSpec:
    """The constraint for ``tool_choice`` required (any tool; an array of calls when
    ``parallel``) or a named function (one call of it)."""
    schema = forced_call_schema(tools, choice, parallel)
    # Compact: whitespace the grammar allows is tokens a forced call may run out of.
    return ConstraintSpec(kind="json_schema", source=schema, field="tool_choice", compact=True)


def calls_from_forced(
    text: str, parallel: bool, family: ToolFamily, cut: bool = False
) -> list[ToolCall]:
    """The calls in an answer written under ``forced_call_spec``: one call object, or with
    ``parallel`` an array of them. A call repeated word for word is kept once (small models
    loop on parallel calls). ``[]`` when the answer is not whole; but an array of calls ``cut``
    short by max_tokens gives the calls it completed."""
    try:
        value = loads(text)
    except ValueError:
        if not (cut and parallel):
            return []
        value = _whole_items(text)
    items = value if parallel and isinstance(value, list) else [value]
    calls: list[ToolCall] = []
    seen: set[tuple[str, str]] = set()
    for item in items:
        if not isinstance(item, dict):
            return []
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return []
        key = (name, arguments_text(arguments))
        if key not in seen:
            seen.add(key)
            calls.append(ToolCall(new_call_id(family), *key))
    return calls


# The start of a call object being written, once its name is whole: {"name": "f", "arguments":
_CALL_START = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"(\s*,\s*"arguments"\s*:\s*)?')


def partial_forced_call(text: str, family: ToolFamily) -> ToolCall | None:
    """The call an answer under ``forced_call_spec`` was writing when it was cut short (by
    max_tokens or a stop string), once its name is whole: its arguments are the text written so
    far, which is not valid JSON (OpenAI and vLLM return a call cut by the length limit so).
    None when not even the name was written."""
    start = _CALL_START.search(text)
    if start is None:
        return None
    name = json.loads(f'"{start[1]}"')
    rest = text[start.end() :] if start[2] else ""
    decoded = decode_at(rest, 0)
    if decoded is not None and isinstance(decoded[0], dict):
        rest = arguments_text(decoded[0])  # the arguments were whole: only the call's "}" was cut
    return ToolCall(new_call_id(family), name, rest)


def _whole_items(text: str) -> list[Any]:
    """The complete elements at the start of a JSON array whose text was cut off."""
    start = text.find("[")
    if start < 0:
        return []
    items: list[Any] = []
    pos = start + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        decoded = decode_at(text, pos)
        if decoded is None:
            return items
        item, pos = decoded
        items.append(item)
